#pragma once
// What one rank's memory holds, as dhelix-run measures it: the model states (weights,
// gradients, optimizer states: exact byte counts of what the engine allocated) and the
// activation arena (runtime/memory/arena_plan.h): its size, which is the high-water mark of
// activation memory because every activation buffer of an iteration has a fixed place in it,
// and each buffer's place and lifetime, from which the activation bytes live at any moment
// of a traced iteration follow (dhelix-run --trace's "memory" counter track).
//
// The plan predicts the same four terms per stage (schemes[].memory, planner/memory_model.h)
// for the model's data type; a backend with other element sizes (bf16 activations on CUDA for
// an fp32 model file) states its own in activation_element_bytes, and dhelix-diff --measured
// scales the prediction by it before comparing. The plan's activation model counts what the
// backward reads of the forward; the runtime's working set on top of it (temporaries,
// gradient buffers) is in the arena but not in that count: activation_counted_peak_bytes is
// the figure to compare, activation_arena_bytes what the rank really holds.

#include <cstdint>
#include <string>
#include <vector>

namespace dhelix::rt {

/// One activation buffer of the arena.
struct ArenaBufferRecord {
  std::string name;  ///< "mb3.L5.q", "mb0.residual.4", "mb1.head.logits", ...
  int64_t offset = 0;
  int64_t bytes = 0;
  /// The instructions (indices into the co-executed rank program) of its first and last
  /// use: it is live from the start of `first_instruction` to the end of `last_instruction`;
  /// -1 / -1 for a buffer live over the whole iteration (tokens, received messages, losses).
  int64_t first_instruction = -1;
  int64_t last_instruction = -1;
  /// The bytes of it the plan's activation model (planner/memory_model.h) counts: what the
  /// backward reads of the forward (the recomputed copy under recompute), the layers'
  /// inputs, and the head's logits and their gradient (the plan's logits and fp32 softmax),
  /// whole; under sequence parallelism the gathered GEMM
  /// inputs (attn_in, mlp_in) 1/tp of them, the sharded input Megatron keeps (the runtime
  /// keeps the gathered one instead of gathering it again in the backward). The rest is the
  /// runtime's working set: the forward's temporaries, the backward's gradient buffers,
  /// the residual gradients and the embedding's and the CP ring's messages.
  int64_t counted_bytes = 0;
};

struct MemoryReport {
  int64_t weight_bytes = 0;     ///< master weights and any compute copies
  int64_t gradient_bytes = 0;   ///< the weights' gradient accumulators
  int64_t optimizer_bytes = 0;  ///< AdamW's moments (the shard, with a distributed optimizer)
  /// The activation arena's size: no activation allocation happens outside it.
  int64_t activation_arena_bytes = 0;
  /// The most bytes of activation buffers live at once at any point of the rank program
  /// (a lower bound on any arena for these lifetimes).
  int64_t activation_live_peak_bytes = 0;
  /// The most bytes the plan counts (ArenaBufferRecord::counted_bytes) live at once: the figure to
  /// hold against the plan's activation prediction.
  int64_t activation_counted_peak_bytes = 0;
  /// Bytes of one activation element on this backend (4: fp32 on the CPU; 2: bf16 on CUDA).
  int64_t activation_element_bytes = 4;
  std::vector<ArenaBufferRecord> buffers;

  // What a model-state term holds per parameter, so that dhelix-diff --measured compares
  // parameter counts (bytes x shards / bytes per parameter) with the plan's and explains a
  // difference in bytes by these sizes (emitter/measured_memory.h). The defaults are the
  // CPU backend's: fp32 master weights that the ops read (4), fp32 gradients (4), AdamW's
  // two fp32 moments (8), every rank holding its parameters' optimizer states (1 shard).
  int64_t weight_bytes_per_parameter = 4;
  int64_t gradient_bytes_per_parameter = 4;
  int64_t optimizer_bytes_per_parameter = 8;
  /// Ranks a parameter's optimizer states are split over (1: not split).
  int64_t optimizer_shards = 1;
  /// Of optimizer_bytes, the MoE experts' states, split over expert_optimizer_shards ranks
  /// (the expert-data-parallel group) instead; the rest is split over optimizer_shards.
  int64_t expert_optimizer_bytes = 0;
  int64_t expert_optimizer_shards = 1;
};

}  // namespace dhelix::rt
