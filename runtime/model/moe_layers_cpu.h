#pragma once
// The MoE MLP of every layer of a CPU stage model, bound to the plan's ops
// (lib/dag_builder_moe.cc) with the math of runtime/cpu/moe_cpu.h and expert parallelism
// over the EP group (Megatron-Core's all-to-all token dispatcher):
//
//   forward   router ─ permute ─ dispatch_a2a ─ grouped_fc1 ─ swiglu ─ grouped_fc2 ─
//             combine_a2a ─ unpermute                              (ln_mlp before, bda_mlp after)
//   backward  unpermute ─ combine_a2a ─ grouped_fc2_dgrad / _wgrad ─ swiglu ─
//             grouped_fc1_dgrad / _wgrad ─ dispatch_a2a ─ permute;  unpermute ─ router ─
//             router_wgrad;  ln_mlp sums permute's and router's input gradients
//
// Experts: E in all, L = E / ep on each EP rank, EP rank j holding [j L, (j + 1) L). The
// rank's kept token copies leave permute grouped by expert (ascending), so the block for
// EP rank j is contiguous; the dispatch sends, per destination, L chunks (one per expert)
// whose counts travel first (Communicator::all_to_all_v). What arrives is source-major
// (EP rank 0's copies for each local expert, then rank 1's...); the dispatch's local step
// regroups it expert-major for the grouped GEMMs, and grouped_fc2 writes its output back
// source-major for the combine, which returns every copy to the rank it came from, in its
// permuted order. The backward moves gradients the same way reversed. Without EP (ep = 1)
// the plan has no all-to-all and the experts read permute's buffer directly.
//
// Per micro-batch state. The number of kept copies varies with the routing, so every
// buffer is allocated at its bound when a (micro-batch, layer) pair is first bound and the
// counts of this iteration live beside them (the collectives read them when they run):
// N k copies leave a rank (N its tokens: T, or T / tp under TP), at most ep N k arrive, and
// with expert TP etp times those are gathered (moe_layers_cpu_internal.h).
//
// Weights, as Mixtral's: router [E, h]; experts' fc1 [L, 2F, h] (gate rows, then up rows)
// and fc2 [L, h, F] for the local experts only (F / etp wide under expert TP). Their initial values
// are those of the full tensors of all E experts (element index by global expert), so an EP 2 run
// starts from the same model as an EP 1 run. The router's gradient is summed over the dp group like
// the other dense weights; the experts' over the expert-data-parallel group (ParameterView::
// expert, runtime/comm/process_groups.h).
//
// The auxiliary load-balancing loss of a layer and micro-batch (moe_capacity.h) enters the
// training objective with weight 1 / (micro-batches x dp), the weight of one micro-batch's
// mean cross-entropy: its gradient is scaled by loss_scale x T (loss_scale = 1 / tokens of
// the global batch) and aux_loss_sum() adds it to the reported loss. Under TP (and CP) a
// rank's aux loss is that of its own rows, weighted 1 / tp: the objective takes the mean
// over the TP ranks (Megatron-Core instead all-reduces the token counts per expert over
// TP x CP, a collective the plan does not have).
//
// The shared expert (Qwen2-MoE, ModelSpec's shared_expert_ffn_hidden_size): a dense SwiGLU
// MLP every token passes, its output scaled by a per-token sigmoid gate sigmoid(x w_g) and
// added to the routed experts' (the planner leaves the h -> 1 gate GEMM out of its costs;
// moe_shared_expert_cpu.cc says where it runs). Its weights are dense: gate [h], fc1
// [2Fs/tp, h], fc2 [h, Fs/tp] (TP slices; the gate replicated).
//
// Tensor parallelism (tp > 1, with sequence parallelism as the planner requires): the MoE
// layer works on the rank's T / tp rows from ln_mlp and returns T / tp rows to bda_mlp; the
// router is replicated (its gradient summed over TP). With expert tensor parallelism (etp =
// tp, Megatron-Core's --expert-tensor-parallel-size) each TP rank holds 1/etp of every local
// expert's FFN columns and the plan's etp_allgather / etp_reduce_scatter exchange the rows
// over TP (moe_expert_tp_cpu.cc); with etp = 1 each holds whole experts, has no TP
// exchange, and the experts' gradients are summed over TP as well.
//
// Full activation recompute: the repeated forward ops (bwd.recompute.<op>) and every
// backward op use a second set of buffers (bind's `recomputing`). Selective recompute
// repeats only the core attention and leaves the MoE MLP as it is.
//
// The shared expert (moe_shared_expert_cpu.cc) is tensor-parallel like a dense MLP under
// TP. Limits (refused before training, runtime/train/moe_support.h): a shared expert width
// that tp does not divide.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "runtime/cpu/moe_cpu.h"
#include "runtime/memory/buffer_spans.h"
#include "runtime/model/moe_layers_of.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// The buffers of the dense layer the MoE MLP connects to, for one (micro-batch, layer).
struct MoeLayerIo {
  const float* x = nullptr;   ///< the MLP's input [T, h] (ln_mlp's output)
  float* y = nullptr;         ///< the MLP's output [T, h] (what bda_mlp adds)
  const float* dy = nullptr;  ///< d y [T, h]
  float* dx = nullptr;        ///< d x [T, h] (what ln_mlp's backward reads)
};

class MoeLayersCpu {
 public:
  /// The MoE MLPs of `layers` (absolute indices) on world rank `rank` of `job`.
  /// `loss_scale` is read when the router's backward runs.
  MoeLayersCpu(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers, uint64_t seed,
               const float* loss_scale);
  ~MoeLayersCpu();
  MoeLayersCpu(const MoeLayersCpu&) = delete;
  MoeLayersCpu& operator=(const MoeLayersCpu&) = delete;

  /// True for the op ids this class binds (fwd.swiglu and bwd.swiglu included: in a MoE
  /// layer they are the experts').
  static bool handles(const std::string& op);
  /// Binds `op` of (micro_batch, layer); nullopt when `op` is not one of handles(). An
  /// all-to-all op with ep = 1 is Error(kInvalidInput) (the planner writes none).
  /// `recomputing`: the op is a full recompute's repeat (bwd.recompute.<op>), or a backward
  /// op of a job with full recompute; both use a second set of buffers, which the repeated
  /// forward fills, so that the backward reads only what the repeat computed.
  std::optional<BoundOp> bind(const std::string& op, int64_t layer, int64_t micro_batch,
                              const MoeLayerIo& io, bool recomputing = false);
  /// The step bwd.ln_mlp runs first: io.dx = permute's + the router's input gradients
  /// (+ the shared expert's through its fc1, + through its gate, in that order).
  BoundOp::Task sum_input_gradient(int64_t layer, int64_t micro_batch, const MoeLayerIo& io,
                                   bool recomputing = false);

  /// `layer`'s router, experts' fc1 and fc2, named "layers.<l>.router", ".experts_fc1",
  /// ".experts_fc2" (the experts' marked expert), then the shared expert's ".shared_gate",
  /// ".shared_fc1", ".shared_fc2" when the model has one.
  std::vector<ParameterView> parameters(int64_t layer);
  /// Sum of the load-balancing losses of micro-batches [0, micro_batches) over this rank's
  /// layers (each micro-batch's own mean, as the cross-entropy), from the last forward.
  float aux_loss_sum(int64_t micro_batches) const;
  /// Token copies dropped over capacity in the last forward, over micro-batches and layers.
  int64_t dropped_copies() const;

  /// Where the layers' activation buffers come from: allocate(span kind, micro_batch,
  /// layer, name, count, counted_share) returns count floats of the stage model's
  /// activation arena (runtime/model/activation_arena.h; counted_share as its allocate's).
  /// Until one is set, each buffer is a zeroed allocation of the layers' own.
  using Allocator =
      std::function<float*(SpanKind kind, int64_t micro_batch, int64_t layer, std::string_view name,
                           int64_t count, int64_t counted_share)>;
  void set_allocator(Allocator allocate) { allocate_ = std::move(allocate); }
  /// Forgets every (micro-batch, layer) state: the arena's layout pass bound them with
  /// fake addresses (BasicStageModel::plan_activation_memory).
  void drop_states();

 private:
  struct Weights;
  struct State;
  State& state(int64_t micro_batch, int64_t layer, bool recomputing);
  std::optional<BoundOp> bind_shared(const std::string& op, int64_t layer, int64_t micro_batch,
                                     const MoeLayerIo& io, bool recomputing);
  // The etp_ exchanges of expert tensor parallelism (moe_expert_tp_cpu.cc).
  std::optional<BoundOp> bind_expert_tp(const std::string& op, State& s);

  cpu::MoeLayerShape shape_;
  int64_t tp_ = 1;          // TP group size (the MoE layer works on T / tp rows with SP)
  int64_t etp_ = 1;         // expert tensor parallelism: 1 or tp
  int64_t ep_ = 1;          // EP group size
  int64_t ep_rank_ = 0;     // this rank's index in it
  int64_t local_ = 0;       // L: experts held here
  int64_t shared_ffn_ = 0;  // Fs: the shared expert's FFN width (0: none)
  const float* loss_scale_;
  bool full_recompute_ = false;
  Allocator allocate_;
  std::vector<std::unique_ptr<float[]>> own_buffers_;  // without an allocator
  std::map<int64_t, std::unique_ptr<Weights>> weights_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<State>> states_;  // (mb, layer)
  // Full recompute's second set (bind's `recomputing`); its aux losses are not counted twice.
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<State>> recompute_states_;
};

/// The CPU backend's MoE layers (moe_layers_of.h).
template <>
struct MoeLayersOf<CpuBackend> {
  using type = MoeLayersCpu;
  using Io = MoeLayerIo;
  static std::unique_ptr<MoeLayersCpu> make(const JobSpec& job, int64_t rank,
                                            const std::vector<int64_t>& layers, uint64_t seed,
                                            const float* loss_scale, CpuBackend::Memory&) {
    return std::make_unique<MoeLayersCpu>(job, rank, layers, seed, loss_scale);
  }
};

}  // namespace dhelix::rt
