#pragma once
// A layer's parameters under fully sharded data parallelism (the plan's options.fsdp,
// strategy optim_grads_params): the shard each rank owns (fsdp_layout.h), the whole weights
// the plan's gathers make, and the three ops that move them (lib/dag_builder_fsdp.cc):
//
//   op                        collective over DP        reads            writes
//   fwd.fsdp_gather           all_gather, s per member  the shard        forward weights (mb, l)
//   bwd.fsdp_gather           all_gather                the shard        backward weights (mb, l)
//   bwd.fsdp_reduce_scatter   reduce_scatter, s out     whole gradient   reduced shard (mb, l)
//
// Failure rules: dense layers only (a mixture of experts' expert collectives run over the
// expert-data-parallel group, which the plan's collectives, named by dimension, cannot name
// yet), cp = 1: StageModel refuses the rest by name
// (check_fsdp_supported), before anything runs. Under sequence parallelism the norm gains'
// gradients leave the reduce-scatters partial over TP; the engine sums them on the shard
// (fsdp_layout.h's tp_summed_ranges; runtime/train/cpu_engine.cc says why there).
//
// Backends. Every fill, copy and sum below is the backend's, on the stream of the op it
// belongs to (B::fsdp_fill, B::fsdp_accumulate; CPU: done when called), so on the GPU a
// release is ordered after the layer's last reader, a zeroing before its first writer, as
// the plan's edges order those ops, and the host never waits inside an iteration. With a
// bf16 Act (CudaBackend) each gathered set also has a bf16 copy of the whole weights, the
// GEMMs' operand, written by B::fsdp_compute_copy right after the gather on its stream and
// released with the weights; the gains stay fp32. Checkpoints gather the shards over the
// host's DP communicator on every backend (runtime/train/fsdp_checkpoint.h).
//
// Lifetimes. The whole weights and the whole gradient are activation-arena buffers
// (activation_arena.h), so their memory is reused as the plan's lifetimes allow and the
// rank's peak follows the plan's count of gathered buffers in flight:
//
//   buffer                     span (buffer_spans.h)   released (poisoned) after
//   forward weights, reshard   layer_forward (mb, l)   fwd.bda_mlp, the layer's last forward op
//   backward weights, reshard  layer_backward (mb, l)  bwd.ln_attn, its last op reading weights
//   weights, no reshard        layer_saved (mb, l)     bwd.ln_attn (gathered once, forward)
//   whole gradient             layer_backward (mb, l)  bwd.fsdp_reduce_scatter
//
// Every one of those ops has all the layer's weight-reading ops (or, for the reduce-scatter,
// its gradient-writing ops) as ancestors in the layer DAG, so the release is after the last
// use in every schedule. Released buffers are filled with all-ones (NaN in fp32): an op that
// reads weights after their release computes NaN, which the trainer's finite checks stop
// (tests/runtime/fsdp_test.cc). Full activation recompute repeats the forward but not its
// gather: the repeated ops read the backward's weights, gathered by bwd.fsdp_gather before
// the repeat (reshard) or kept from the forward (lib/dag_builder_recompute.cc), as FSDP2
// unshards once before the checkpoint's replay; selective recompute repeats the core
// attention, which reads no weights.
//
// Gradients, in a fixed order. The whole gradient of (mb, l) is zeroed by the first op of
// the micro-batch's backward that writes a weight gradient (they all run on the compute
// stream, one at a time), accumulated by them, and reduce-scattered into the micro-batch's
// own reduced shard (s elements, outside the arena). finish_iteration then adds the reduced
// shards into the shard's gradient in micro-batch order 0, 1, ...: the same additions
// whatever order the co-executed schedule ran the reduce-scatters in, so --verify is
// bitwise. Against plain DP (a local sum over micro-batches, then one all-reduce over DP)
// the additions are reassociated: docs/kernels.md states the tolerance.

#include <fmt/format.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/model/fsdp_layout.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

/// True for the FSDP op ids.
inline bool is_fsdp_op(const std::string& op) {
  return op == "fwd.fsdp_gather" || op == "bwd.fsdp_gather" || op == "bwd.fsdp_reduce_scatter";
}

/// Which whole weights an op reads: the forward's or the backward's (full recompute's
/// repeated forward reads the backward's: lib/dag_builder_recompute.cc).
enum class FsdpUse { kForward, kBackward };

/// One micro-batch's gradient bookkeeping for one layer; lives as long as the model (the
/// closures hold its address).
struct FsdpMicroBatch {
  float* reduced = nullptr;       ///< s elements: the reduce-scatter's result
  bool gradient_live = false;     ///< the whole gradient was zeroed for this backward
  bool reduce_scattered = false;  ///< this iteration's reduce-scatter ran
};

/// One layer's shard on this rank.
template <class B>
struct FsdpLayer {
  FsdpLayout layout;
  std::string name;           ///< "layers.<l>.fsdp_shard", the parameter view's
  float* values = nullptr;    ///< s elements, fp32 master weights
  float* gradient = nullptr;  ///< s elements, summed over micro-batches
  std::map<int64_t, FsdpMicroBatch> micro_batches;
};

/// Whole weights (and, for the backward, the whole gradient) of one (mb, l) and the
/// layer's tensors as views of them.
template <class B>
struct FsdpGathered {
  float* weights = nullptr;
  typename B::Act* compute = nullptr;  ///< bf16 Act: the weights' copy; fp32: weights
  float* gradient = nullptr;           ///< null for the forward's set
  LayerParameters<B> params;
};

/// True when the backend's GEMMs read a copy of the weights in another type than fp32.
template <class B>
inline constexpr bool kFsdpComputeCopy = !std::is_same_v<typename B::Act, float>;

/// The layer's tensors as views of gathered `weights`, their `compute` copy and `gradient`
/// (may be null).
template <class B>
LayerParameters<B> fsdp_tensor_views(const FsdpLayout& layout, float* weights,
                                     typename B::Act* compute, float* gradient) {
  LayerParameters<B> p;
  Parameter<B>* tensors[] = {&p.ln_attn, &p.w_qkv, &p.w_proj, &p.ln_mlp, &p.w_fc1, &p.w_fc2};
  DHELIX_CHECK(layout.names().size() == std::size(tensors));
  for (size_t i = 0; i < std::size(tensors); ++i) {
    Parameter<B>& t = *tensors[i];
    t.name = layout.names()[i];
    t.count = layout.counts()[i];
    t.values = weights + layout.offsets()[i];
    t.compute = compute + layout.offsets()[i];
    t.gradient = gradient != nullptr ? gradient + layout.offsets()[i] : nullptr;
  }
  return p;
}

/// fwd/bwd.fsdp_gather: this rank's shard into the whole weights, then (bf16 Act) their
/// compute copy on the same stream.
template <class B>
BasicBoundOp<B> fsdp_gather_op(const FsdpLayer<B>& layer, const FsdpGathered<B>& set) {
  BasicBoundOp<B> op;
  op.collective = CollectiveRequest{.kind = CollectiveKind::kAllGather,
                                    .element = ElementType::kFloat32,
                                    .in = layer.values,
                                    .out = set.weights,
                                    .count = layer.layout.shard()};
  if constexpr (kFsdpComputeCopy<B>) {
    op.after_collective = [weights = set.weights, compute = set.compute,
                           padded = layer.layout.padded()](const typename B::Exec& e) {
      B::fsdp_compute_copy(e, padded, weights, compute);
    };
  }
  return op;
}

/// Fills the whole weights of `set` (and their compute copy) with all-ones: released.
template <class B>
void fsdp_release(const typename B::Exec& e, float* weights, typename B::Act* compute,
                  int64_t padded) {
  B::fsdp_fill(e, weights, padded * static_cast<int64_t>(sizeof(float)), 0xFF);
  if constexpr (kFsdpComputeCopy<B>) {
    B::fsdp_fill(e, compute, padded * static_cast<int64_t>(sizeof(typename B::Act)), 0xFF);
  }
}

/// bwd.fsdp_reduce_scatter: the micro-batch's whole gradient into its reduced shard; then
/// the whole gradient is released.
template <class B>
BasicBoundOp<B> fsdp_reduce_scatter_op(const FsdpLayer<B>& layer, FsdpMicroBatch& state,
                                       float* gradient, int64_t layer_index, int64_t micro_batch) {
  BasicBoundOp<B> op;
  op.collective = CollectiveRequest{.kind = CollectiveKind::kReduceScatter,
                                    .element = ElementType::kFloat32,
                                    .in = gradient,
                                    .out = state.reduced,
                                    .count = layer.layout.shard()};
  // A reduce-scatter before any gradient op ran would send the poison of the last release.
  op.before_collective = [&state, layer_index, micro_batch](const typename B::Exec&) {
    if (!state.gradient_live) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("bwd.fsdp_reduce_scatter of layer {} micro-batch {} ran before any "
                              "of the layer's weight-gradient ops (the plan must order it after "
                              "them)",
                              layer_index, micro_batch));
    }
  };
  op.after_collective = [&state, gradient,
                         bytes = layer.layout.padded() * 4](const typename B::Exec& e) {
    B::fsdp_fill(e, gradient, bytes, 0xFF);
    state.gradient_live = false;
    state.reduce_scattered = true;
  };
  return op;
}

/// Runs `before` and `after` around `op`'s computation, with its Exec (its stream).
template <class B, class Before, class After>
void fsdp_wrap(BasicBoundOp<B>& op, Before before, After after) {
  DHELIX_CHECK(static_cast<bool>(op.compute));
  op.compute = [inner = std::move(op.compute), before, after](const typename B::Exec& e) {
    before(e);
    inner(e);
    after(e);
  };
}

}  // namespace dhelix::rt::model_detail
