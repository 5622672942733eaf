#pragma once
// The model slice one rank trains: a Llama-style decoder (token embedding, RMSNorm, RoPE,
// causal attention with GQA, SwiGLU MLP, final norm, output head, cross-entropy) cut by
// tensor parallelism (Megatron column/row parallel linear layers, with or without sequence
// parallelism) and by the pipeline (the layers of this rank's stage, plus the embedding
// and/or the head when the stage holds them).
//
// The plan interpreter (runtime/exec/) never computes anything itself: for every op of the
// plan it asks the StageModel to bind that op, by the layer DAG's op id
// (lib/dag_builder*.cc: "fwd.gemm_qkv", "bwd.fc1_wgrad", "fwd.embedding", ...), for one
// layer and one micro-batch. Binding allocates the buffers the op touches and returns
//   * compute ops: a closure the compute stream runs later, given the backend's execution
//     context (B::Exec: nothing on the CPU, the stream and cuBLAS handle on CUDA);
//   * communication ops: a CollectiveRequest the interpreter runs on a communication
//     stream through the TP communicator (runtime/comm/communicator.h), optionally with a
//     closure to run after the collective (for instance combining gathered loss statistics).
// All binding happens on one thread before execution starts, so no container is resized
// while closures run; closures of different (micro-batch, layer) pairs touch disjoint
// buffers, except the gradient accumulators of the weights (wgrad ops), which the
// interpreter runs on the one compute stream in plan order.
//
// The residual stream between layers: residual(mb, l) is the input of layer l (the output
// of layer l - 1); residual(mb, num_layers) is the input of the final norm.
// residual_grad(mb, l) is the gradient with respect to residual(mb, l + 1), i.e. the
// output of layer l; residual_grad(mb, -1) is the gradient of the embedding's output.
// Pipeline transfers move exactly these buffers (boundary_elements() elements each).
//
// Backends. The model is written once, as a template over a backend B
// (runtime/model/model_backend.h): B says what an activation element is, where buffers
// live and which kernels run. StageModel is the CPU backend's (fp32, host memory, closures
// that compute when called); runtime/cuda/cuda_stage_model.h instantiates the same code
// for the CUDA backend (bf16 activations in device memory, closures that enqueue kernels on
// the stream they are given). So the op wiring the CPU tests check is the wiring the GPU
// runs.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/rank_program.h"
#include "runtime/memory/buffer_spans.h"
#include "runtime/memory/memory_report.h"
#include "runtime/model/cpu_backend.h"
#include "runtime/model/element_type.h"
#include "runtime/model/fsdp_layout.h"
#include "runtime/model/model_backend.h"

namespace dhelix::rt {

enum class CollectiveKind {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kRingExchange,  ///< the context-parallel ring's step (Communicator::ring_exchange)
  kAllToAllV,     ///< expert parallelism's dispatch and combine (Communicator::all_to_all_v)
};
const char* collective_kind_name(CollectiveKind kind);  ///< "all_gather", ...

/// A collective over the op's group (tensor-parallel; the CP ring's steps over the
/// context-parallel group; all_to_all_v over the expert-parallel group), with its buffers
/// (owned by the model).
struct CollectiveRequest {
  CollectiveKind kind = CollectiveKind::kAllGather;
  ElementType element = ElementType::kFloat32;
  /// all_gather: count; reduce_scatter: tp * count; all_reduce: unused; ring_exchange: the
  /// count elements sent to the next CP rank
  const void* in = nullptr;
  /// all_gather: tp * count; reduce_scatter: count; all_reduce: in/out; ring_exchange: the
  /// count elements received from the previous CP rank
  void* out = nullptr;
  int64_t count = 0;  ///< see Communicator; all_to_all_v: out's capacity
  /// all_to_all_v only: `chunks` element counts per member, read when the collective runs
  /// (an op before it writes them), and where the members' counts for this rank go.
  const int64_t* send_counts = nullptr;
  int64_t* recv_counts = nullptr;
  int64_t chunks = 1;

  /// The buffers as fp32 (the CPU communicators' type); Error(kInternal) for another type.
  const float* in_f32() const;
  float* out_f32() const;
};

/// What running one op means on backend B.
template <class B>
struct BasicBoundOp {
  using Task = std::function<void(const typename B::Exec&)>;
  Task compute;                                 ///< compute ops; empty for communication
  std::optional<CollectiveRequest> collective;  ///< communication ops
  Task after_collective;                        ///< optional local step after it
  /// Optional local step before it, on the communication stream (the CP ring's backward
  /// adds this rank's dK, dV share to the one it forwards: runtime/model/layer_ops_cp.h).
  Task before_collective;
};

/// Which op, of which layer, for which micro-batch.
struct OpRef {
  std::string op;           ///< layer DAG op id without any "L<k>." prefix
  int64_t layer = -1;       ///< absolute layer index; -1 for stage extras (embedding, head, loss)
  int64_t micro_batch = 0;  ///< 0-based within the iteration
};

/// One named parameter tensor of this rank and its gradient, in the backend's memory.
template <class B>
struct BasicParameterView {
  std::string name;           ///< "layers.3.w_qkv", "embedding", "head", "final_norm", ...
  float* values = nullptr;    ///< fp32 master weights
  float* gradient = nullptr;  ///< fp32
  /// The copy the ops read (B::Act); the same memory as values where Act is float. After
  /// changing values, refresh it (BasicStageModel::refresh_compute_copies). Null for an
  /// FSDP shard on a bf16 backend: its gathers make the whole layer's copy.
  typename B::Act* compute = nullptr;
  int64_t count = 0;
  /// True for weights every TP rank holds whole (norm gains) whose gradient each rank only
  /// partly computes under sequence parallelism: the trainer all-reduces it over TP.
  bool sum_gradient_over_tp = false;
  /// True for MoE experts' weights (EP-sharded): the trainer sums their gradient over the
  /// expert-data-parallel group instead of dp (runtime/comm/process_groups.h).
  bool expert = false;
  /// True for a layer's FSDP shard ("layers.<l>.fsdp_shard": runtime/model/fsdp_layers.h):
  /// its gradient is already summed over DP by the plan's reduce-scatters, so the
  /// iteration-end reduction skips it; checkpoints keep its whole tensors (fsdp_layout).
  bool fsdp_shard = false;
};

/// Fully sharded data parallelism (the plan's options.fsdp, strategy optim_grads_params:
/// runtime/model/fsdp_layers.h): every layer's weights, gradients and AdamW moments sharded
/// over the DP group, gathered by the plan's fsdp ops.
struct FsdpSettings {
  bool enabled = false;
  bool reshard_after_forward = true;  ///< gather again before the backward
};

/// Tokens of one micro-batch: batch sequences of seq tokens, row-major, and their targets
/// (the next tokens); every TP rank of a stage gets the same micro-batch.
struct MicroBatchTokens {
  std::vector<int32_t> tokens;   ///< micro_batch_size * seq_length
  std::vector<int32_t> targets;  ///< same size; a negative target is ignored
};

template <class B>
class BasicStageModel {
 public:
  using Act = typename B::Act;
  using BoundOp = BasicBoundOp<B>;
  using ParameterView = BasicParameterView<B>;

  /// The slice of `job` that world rank `rank` holds: layers [first, first + count) of
  /// each chunk in `layer_ranges`, the embedding when `embedding`, the final norm, head and
  /// loss when `head`. Parameters are initialised from `seed` so that a weight's value
  /// depends only on (seed, tensor, global index): every TP layout of one model starts
  /// from the same full weights. `memory` says where buffers live (B::MemoryConfig).
  /// Throws Error(kUnsupported) for models or settings the runtime does not run (MoE on
  /// another backend than the CPU's, and there with tp > 1 or recompute; linear biases,
  /// non-RMSNorm, non-SwiGLU, non-RoPE positions, tied embeddings, a sequence cp > 1
  /// cannot cut into 2·cp chunks), listing every such setting, and for cp > 1 on a
  /// backend without the ring kernels (runtime/model/layer_ops_cp.h). With `fsdp` enabled
  /// the layers keep only this rank's DP shard (fsdp_layers.h, which says what is refused).
  BasicStageModel(const JobSpec& job, int64_t rank,
                  std::vector<std::pair<int64_t, int64_t>> layer_ranges, bool embedding, bool head,
                  uint64_t seed, typename B::MemoryConfig memory = {}, FsdpSettings fsdp = {});
  ~BasicStageModel();
  BasicStageModel(const BasicStageModel&) = delete;
  BasicStageModel& operator=(const BasicStageModel&) = delete;

  /// Gives micro-batch `micro_batch` its tokens (before running its ops; they are copied
  /// into storage the bound ops read, so a later call feeds ops bound earlier). Throws
  /// Error(kInvalidInput) for a wrong count or a token or target outside the vocabulary.
  void set_tokens(int64_t micro_batch, MicroBatchTokens tokens);
  /// Binds one op (see the file comment). Throws Error(kUnsupported) naming an op id this
  /// model does not implement, Error(kInvalidInput) for a layer (or the embedding or head)
  /// this rank does not hold and for a comm op of another TP mode (e.g. an all-reduce op
  /// under sequence parallelism). fwd.allreduce_loss is bound as an all_gather of 3 fp32
  /// values per token (see runtime/model/stage_ops.h). With the job's activation recompute,
  /// bwd.recompute.<op> binds fwd.<op> over the layer's recompute buffers, which every
  /// backward op then reads (docs/runtime.md, "Activation recompute").
  BoundOp bind(const OpRef& ref);

  /// Lays out the activation arena for `programs` (every program this rank will run, each
  /// with the order its executor gives it, `orders`: runtime/exec/stream_lowering.h's
  /// program_orders; runtime/model/activation_arena.h) unless the environment says
  /// DHELIX_ACTIVATION_ARENA=separate: binds each instruction once to learn the buffers,
  /// plans their places from the programs' lifetimes and forgets the bindings, so that
  /// later binding (the executors') puts every activation in the arena. Call once, before
  /// the first execution; without it every buffer is an allocation of its own.
  void plan_activation_memory(const std::vector<const RankProgram*>& programs,
                              const std::vector<ProgramOrder>& orders);
  /// The activation part of the rank's memory report (zero before plan_activation_memory).
  void fill_memory_report(MemoryReport& report) const;

  /// Elements in one residual-stream buffer (rows of this rank x hidden).
  int64_t boundary_elements() const;
  /// The element type of activations (and of the residual stream's buffers).
  static constexpr ElementType activation_type() { return B::kActivationType; }
  /// The input of layer `layer` for `micro_batch` (allocated on first use).
  Act* residual(int64_t micro_batch, int64_t layer);
  /// The gradient of layer `layer`'s output for `micro_batch` (allocated on first use).
  Act* residual_grad(int64_t micro_batch, int64_t layer);

  /// Mean cross-entropy of each micro-batch whose loss ran on this rank (index = micro-batch;
  /// NaN for those that did not run here), read back once the iteration's work has
  /// finished. The loss gradient is scaled by loss_scale.
  std::vector<float> micro_batch_losses();
  /// Factor applied to d(loss)/d(logit) per token; the trainer sets 1 / (tokens per
  /// micro-batch x micro-batches x dp) so that gradients are those of the global mean.
  /// Until then it is 1 / (tokens per micro-batch): the gradient of one micro-batch's mean.
  void set_loss_scale(float scale);

  /// Every parameter of this rank, in a fixed order (layers ascending, each with its MoE
  /// router and experts after its dense tensors; then extras).
  std::vector<ParameterView> parameters();
  /// MoE models: the sum over this rank's layers and micro-batches [0, micro_batches) of
  /// the load-balancing loss of the last forward (0 without MoE; moe_layers_cpu.h), and the
  /// token copies dropped over capacity in it.
  float moe_aux_loss_sum(int64_t micro_batches) const;
  int64_t moe_dropped_copies() const;
  /// FSDP: adds every micro-batch's reduce-scattered layer gradients into the shards'
  /// gradients, in micro-batch order (fsdp_layers.h); call after each execution of a
  /// program. Error(kInternal) naming the layer and micro-batch whose reduce-scatter did
  /// not run. Nothing without FSDP. The sums are the backend's on `exec` (CUDA: enqueued
  /// on its stream, after the execution's work).
  void finish_iteration(const typename B::Exec& exec = {});
  /// FSDP: elements of the micro-batches' reduced gradient shards (fsdp_layers.h), kept
  /// besides the shards' own gradients; 0 without FSDP.
  int64_t fsdp_reduced_elements() const;
  /// The layout of FSDP shard view `name` ("layers.<l>.fsdp_shard"); null for another.
  const FsdpLayout* fsdp_layout(const std::string& name) const;
  /// Rewrites the compute copies from the master weights (nothing where they are one).
  void refresh_compute_copies();
  /// Zeroes every gradient and forgets every micro-batch's losses (NaN, num_micro_batches
  /// of them). Buffers stay allocated, so ops bound in an earlier iteration stay valid.
  void start_iteration(int64_t num_micro_batches);

 private:
  struct Impl;
  BoundOp bind_moe(const OpRef& ref);
  std::unique_ptr<Impl> impl_;
};

extern template class BasicStageModel<CpuBackend>;

/// The CPU backend's model (fp32, host memory): what dhelix-run runs without a GPU.
using StageModel = BasicStageModel<CpuBackend>;
using BoundOp = BasicBoundOp<CpuBackend>;
using ParameterView = BasicParameterView<CpuBackend>;

}  // namespace dhelix::rt
