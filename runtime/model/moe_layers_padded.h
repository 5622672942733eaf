#pragma once
// The MoE MLP of every layer on a device backend, bound to the plan's ops as
// runtime/model/moe_layers_cpu.h binds them on the CPU (read that file first: the same op
// chain, weights, initial values, gradient groups and aux-loss weight), with every buffer
// between permute and unpermute padded to the capacity (runtime/kernels/moe_padded.h).
// Backend-generic like layer_ops_cp.h: the CUDA backend runs it on its kernels
// (runtime/cuda/moe_cuda.h, PaddedMoeBackend's functions), the recording fake of
// tests/device on records of them, and tests/runtime's PaddedCpuBackend on their host twin
// (runtime/cpu/moe_padded_cpu.h), where moe_layers_padded_test.cc checks its values against
// the CPU layer's in every setting below. What differs from the CPU:
//
//   * shapes are fixed on the host: E C rows in the rank's permuted layout, and the same
//     E C = ep L C rows arrive from the EP group (L C from each member), so every buffer is
//     allocated once per (micro-batch, layer) and the expert GEMMs run on ep C rows per
//     local expert; zero padding rows stay zero and add nothing to the weight gradients;
//   * the all-to-alls are the device's padded all_to_all_v (count = E C h, out's
//     capacity; blocks of L C h per member), with the per-expert counts the router writes
//     on the device travelling beside them (nothing reads them back on the host);
//   * the dispatch's local step regroups source-major -> expert-major on the stream
//     (moe_regroup), grouped_fc2 and grouped_fc1_dgrad regroup back before the exchange.
//
// Dropless routing (capacity factor 0) is the capacity T: every expert can take all of a
// rank's T rows (top-k picks k distinct experts), so nothing drops; the price is E / k times
// the expert GEMMs' rows and the all-to-alls' bytes of a balanced load (docs/gpu.md).
//
// Tensor parallelism (with SP): the layer works on the rank's T / tp rows, as the CPU's.
// With expert tensor parallelism (etp = tp) each TP member holds 1/etp of every local
// expert's FFN columns; the plan's etp_allgather and etp_reduce_scatter move the padded
// own rows ([L][ep C], expert-major) as a fixed-size all-gather and reduce-scatter over TP
// (the CPU's all_to_all_v of copies carries counts a padded block does not need), with
// moe_regroup turning member-major [etp][L][ep C] into expert-major [L][etp][ep C] and back
// (moe_expert_tp_padded.h). Context parallelism changes nothing here but T.
//
// Full activation recompute: the repeated forward ops and every backward op use a second
// set of buffers (bind's `recomputing`), as the CPU's; selective recompute leaves the MoE
// MLP alone.
//
// The shared expert (a model's shared_expert_ffn_hidden_size): moe_shared_expert_padded.h.

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/job_spec.h"
#include "lib/placement.h"
#include "lib/rank_shape.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/model/activation_arena.h"
#include "runtime/model/moe_layers_of.h"
#include "runtime/model/moe_op_names.h"
#include "runtime/model/moe_padded_buffers.h"
#include "runtime/model/moe_shared_expert_padded.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {

/// What a backend provides for PaddedMoeLayers: the padded MoE kernels of
/// runtime/cuda/moe_cuda.h (same arguments, the Exec first), and check_moe_shape for its
/// own limits (Error(kUnsupported)).
template <class B>
concept PaddedMoeBackend = requires(const typename B::Exec& e, const kernels::MoePaddedShape& s,
                                    kernels::MoePaddedRouting r, const typename B::Act* in,
                                    typename B::Act* out, const float* dgate, float* dgate_out) {
  B::check_moe_shape(s);
  B::moe_route(e, s, in, r);
  B::moe_permute(e, s, r, in, out);
  B::moe_regroup(e, int64_t{1}, int64_t{1}, int64_t{1}, int64_t{1}, in, out, true);
  B::moe_unpermute(e, s, r, in, out);
  B::moe_unpermute_backward(e, s, r, in, in, out, dgate_out);
  B::moe_permute_backward(e, s, r, in, out);
  B::moe_router_logits_backward(e, s, r, dgate, 1.0f, out);
  requires PaddedSharedExpertBackend<B>;
};

/// The dense layer's buffers the MoE MLP connects to, for one (micro-batch, layer).
template <class A>
struct PaddedMoeIo {
  const A* x = nullptr;   ///< the MLP's input [T, h] (ln_mlp's output)
  A* y = nullptr;         ///< the MLP's output [T, h]
  const A* dy = nullptr;  ///< d y [T, h]
  A* dx = nullptr;        ///< d x [T, h] (what ln_mlp's backward reads)
};

template <class B>
class PaddedMoeLayers {
 public:
  using A = typename B::Act;
  using Io = PaddedMoeIo<A>;
  using BoundOp = BasicBoundOp<B>;
  using ParameterView = BasicParameterView<B>;

  /// The MoE MLPs of `layers` on world rank `rank` of `job`, buffers from `memory` (which
  /// must outlive this). `loss_scale` is read when the router's backward is enqueued.
  /// Throws Error(kUnsupported) for a shape B::check_moe_shape refuses.
  PaddedMoeLayers(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers,
                  uint64_t seed, const float* loss_scale, typename B::Memory& memory);
  ~PaddedMoeLayers();
  PaddedMoeLayers(const PaddedMoeLayers&) = delete;
  PaddedMoeLayers& operator=(const PaddedMoeLayers&) = delete;

  /// True for the op ids this class binds (fwd.swiglu and bwd.swiglu included).
  static bool handles(const std::string& op);
  /// Binds `op` of (micro_batch, layer); nullopt when `op` is not one of handles(). An
  /// all-to-all op with ep = 1, or an etp exchange without expert tensor parallelism, is
  /// Error(kInvalidInput) (the planner writes none). `recomputing`: the op is a full
  /// recompute's repeat (bwd.recompute.<op>) or a backward op of a job with full recompute;
  /// both use a second set of buffers, which the repeated forward fills.
  std::optional<BoundOp> bind(const std::string& op, int64_t layer, int64_t micro_batch,
                              const Io& io, bool recomputing = false);
  /// The step bwd.ln_mlp runs first: io.dx = permute's + the router's input gradients
  /// (+ the shared expert's two: moe_shared_expert_padded.h).
  typename BoundOp::Task sum_input_gradient(int64_t layer, int64_t micro_batch, const Io& io,
                                            bool recomputing = false);
  /// `layer`'s "layers.<l>.router", ".experts_fc1", ".experts_fc2" (the last two expert),
  /// then the shared expert's three when the model has one.
  std::vector<ParameterView> parameters(int64_t layer);
  /// Sum of the load-balancing losses of micro-batches [0, micro_batches) over this rank's
  /// layers; downloads, so call it between iterations only.
  float aux_loss_sum(int64_t micro_batches);
  /// Token copies dropped over capacity in the last forward; downloads, as above.
  int64_t dropped_copies();
  /// C: rows per expert block.
  int64_t capacity() const { return shape_.capacity; }
  /// Buffers from the stage model's activation arena from now on (moe_padded_buffers.h).
  void set_arena(ActivationArena<typename B::Memory>* arena);
  /// Forgets every (micro-batch, layer) state: the arena's layout pass bound them with fake
  /// addresses (BasicStageModel::plan_activation_memory). The buffers outside the arena
  /// stay (moe_padded_buffers.h).
  void drop_states();

 private:
  struct Weights;
  struct State;
  State& state(int64_t micro_batch, int64_t layer, bool recomputing);
  // The etp exchanges of expert tensor parallelism (moe_expert_tp_padded.h).
  std::optional<BoundOp> bind_expert_tp(const std::string& op, State& s);

  kernels::MoePaddedShape shape_;
  int64_t ffn_ = 0;      // F: one expert's FFN columns on this rank (F_e / etp)
  int64_t tp_ = 1;       // TP group size (the layer works on T / tp rows with SP)
  int64_t etp_ = 1;      // expert tensor parallelism: 1 or tp
  int64_t ep_ = 1;       // EP group size
  int64_t ep_rank_ = 0;  // this rank's index in it
  int64_t local_ = 0;    // L = E / ep
  const float* loss_scale_;
  typename B::Memory& memory_;
  PaddedMoeBuffers<typename B::Memory> buffers_;
  std::map<int64_t, std::unique_ptr<Weights>> weights_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<State>> states_;  // (mb, layer)
  // Full recompute's second set (bind's `recomputing`); its aux losses are not counted twice.
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<State>> recompute_states_;
  std::unique_ptr<PaddedSharedExpert<B>> shared_;  // null without a shared expert
};

namespace moe_padded_detail {

inline size_t padded_size(int64_t n) { return static_cast<size_t>(n); }

}  // namespace moe_padded_detail

template <class B>
struct PaddedMoeLayers<B>::Weights {
  model_detail::Parameter<B> router, fc1, fc2;  // [E, h], [L, 2F, h], [L, h, F]
};

template <class B>
PaddedMoeLayers<B>::PaddedMoeLayers(const JobSpec& job, int64_t rank,
                                    const std::vector<int64_t>& layers, uint64_t seed,
                                    const float* loss_scale, typename B::Memory& memory)
    : loss_scale_(loss_scale),
      memory_(memory),
      buffers_(memory, job.parallel.recompute.granularity == RecomputeGranularity::kFull) {
  const MoeSpec& moe = *job.model.moe;
  const RankShape dims = rank_shape(job, rank);
  // As the CPU's (moe_layers_cpu.cc): the planner refuses MoE under TP without SP, and
  // expert TP is 1 or tp.
  DHELIX_CHECK(dims.tp == 1 || dims.sp);
  tp_ = dims.tp;
  etp_ = job.parallel.expert_tp_size();
  DHELIX_CHECK(etp_ == 1 || etp_ == tp_);
  DHELIX_CHECK(moe.expert_ffn_hidden_size % etp_ == 0);
  ep_ = job.parallel.ep;
  DHELIX_CHECK(moe.num_experts % ep_ == 0);
  local_ = moe.num_experts / ep_;
  ep_rank_ = Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).ep;
  ffn_ = moe.expert_ffn_hidden_size / etp_;
  shape_ = kernels::MoePaddedShape{
      .tokens = dims.rows,
      .hidden = dims.hidden,
      .experts = moe.num_experts,
      .top_k = moe.top_k,
      .capacity =  // dropless (cf 0): T, every expert can take all of the rank's rows
      kernels::expert_capacity(dims.rows, moe.top_k, moe.num_experts, moe.capacity_factor),
      .aux_loss_coeff = moe.aux_loss_weight()};
  B::check_moe_shape(shape_);
  // The CPU's initial values: the slice of the full tensors of all E experts this rank
  // holds, so that every EP and ETP split starts from the same model.
  const int64_t h = shape_.hidden, e_all = shape_.experts;
  const model_detail::ExpertSlice slice{.first = ep_rank_ * local_,
                                        .local = local_,
                                        .hidden = h,
                                        .ffn = ffn_,
                                        .full_ffn = moe.expert_ffn_hidden_size,
                                        .etp_rank = etp_ > 1 ? dims.tp_rank : 0};
  const float router_bound = 1.0f / std::sqrt(static_cast<float>(h));
  const float fc2_bound = 1.0f / std::sqrt(static_cast<float>(moe.expert_ffn_hidden_size));
  for (int64_t layer : layers) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    auto place = [&](const std::string& name, std::vector<float> values) {
      return model_detail::place_parameter<B>(
          memory_, model_detail::HostTensor{prefix + name, std::move(values), false});
    };
    std::vector<float> router(moe_padded_detail::padded_size(e_all * h));
    for (int64_t i = 0; i < e_all * h; ++i) {
      router[moe_padded_detail::padded_size(i)] =
          model_detail::init_uniform(seed, prefix + "router", i, router_bound);
    }
    auto w = std::make_unique<Weights>();
    w->router = place("router", std::move(router));
    w->fc1 = place("experts_fc1", model_detail::expert_fc1_initial_values(
                                      seed, prefix + "experts_fc1", slice, router_bound));
    w->fc2 = place("experts_fc2", model_detail::expert_fc2_initial_values(
                                      seed, prefix + "experts_fc2", slice, fc2_bound));
    weights_.emplace(layer, std::move(w));
  }
  if (moe.shared_expert_ffn_hidden_size > 0) {
    shared_ = std::make_unique<PaddedSharedExpert<B>>(job, rank, layers, seed, memory_);
  }
}

template <class B>
PaddedMoeLayers<B>::~PaddedMoeLayers() = default;

template <class B>
bool PaddedMoeLayers<B>::handles(const std::string& op) {
  return names_op(kRoutedMoeOps, op) || names_op(kExpertTpOps, op) ||
         PaddedSharedExpert<B>::handles(op);
}

template <class B>
std::optional<typename PaddedMoeLayers<B>::BoundOp> PaddedMoeLayers<B>::bind(
    const std::string& op, int64_t layer, int64_t micro_batch, const Io& io, bool recomputing) {
  using Exec = typename B::Exec;
  using model_detail::computation;
  if (!handles(op)) return std::nullopt;
  if (PaddedSharedExpert<B>::handles(op)) {
    if (!shared_) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: op {}: the model has no shared expert", op));
    }
    return shared_->bind(op, layer, micro_batch, io, recomputing);
  }
  if (op.ends_with("_a2a") && ep_ == 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {} does not occur with ep = 1", op));
  }
  State& s = state(micro_batch, layer, recomputing);
  if (names_op(kExpertTpOps, op)) return bind_expert_tp(op, s);
  Weights& w = *weights_.at(layer);
  const kernels::MoePaddedShape sh = shape_;
  const int64_t h = sh.hidden, f = ffn_, ep = ep_, etp = etp_, local = local_, c = sh.capacity;
  const int64_t per_expert = etp * ep * c;  // rows each local expert computes on
  const int64_t rows = kernels::padded_rows(sh.experts, c);
  const int64_t gemm_rows = etp * rows;  // all local experts' rows
  // The padded all-to-all over the EP group: out's capacity E C h in blocks of L C h, L
  // counts per member.
  auto all_to_all = [&](const A* in, const int64_t* send, A* out, int64_t* recv) {
    BoundOp bound;
    CollectiveRequest request =
        model_detail::collective(CollectiveKind::kAllToAllV, in, out, rows * h);
    request.send_counts = send;
    request.recv_counts = recv;
    request.chunks = local;
    bound.collective = request;
    return bound;
  };
  // Per local expert e: fn(e, first row); every expert has per_expert rows.
  auto per_expert_gemm = [local, per_expert](auto&& fn) {
    for (int64_t e = 0; e < local; ++e) fn(e, e * per_expert);
  };
  auto regroup = [ep, local, c, h](const A* from, A* to, bool to_expert, const Exec& x) {
    B::moe_regroup(x, ep, local, c, h, from, to, to_expert);
  };
  // After the last expert GEMM: its output (expert-major, the rows the experts computed on)
  // regrouped for the exchange that follows: by TP member ([etp][L][ep C]) for
  // etp_reduce_scatter, else by EP source for the all-to-all; without either the next op
  // reads it where it is.
  auto hand_back = [regroup, ep, etp, local, c, h](const A* out, A* ep_src, A* tp_src,
                                                   const Exec& x) {
    if (etp > 1) {
      B::moe_regroup(x, etp, local, ep * c, h, out, tp_src, false);
    } else if (ep > 1) {
      regroup(out, ep_src, false, x);
    }
  };

  // ---- forward ----
  if (op == "fwd.router") {
    return computation<B>([&s, sh, x = io.x, wr = w.router.compute](const Exec& e) {
      B::linear_forward(e, sh.tokens, sh.hidden, sh.experts, x, wr, s.logits);
      B::moe_route(e, sh, s.logits, s.routing());
    });
  }
  if (op == "fwd.permute") {
    return computation<B>(
        [&s, sh, x = io.x](const Exec& e) { B::moe_permute(e, sh, s.routing(), x, s.permuted); });
  }
  if (op == "fwd.dispatch_a2a") {
    BoundOp bound = all_to_all(s.permuted, s.send_counts, s.received, s.recv_counts);
    bound.after_collective = [&s, regroup](const Exec& e) {
      regroup(s.received, s.expert_in, true, e);
    };
    return bound;
  }
  if (op == "fwd.grouped_fc1") {
    return computation<B>(
        [&s, per_expert_gemm, per_expert, h, f, w1 = w.fc1.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_forward(e, per_expert, h, 2 * f, s.experts_read + row * h, w1 + x * 2 * f * h,
                              s.fc1_out + row * 2 * f);
          });
        });
  }
  if (op == "fwd.swiglu") {
    return computation<B>([&s, gemm_rows, f](const Exec& e) {
      B::swiglu_forward(e, gemm_rows, f, s.fc1_out, s.act);
    });
  }
  if (op == "fwd.grouped_fc2") {
    return computation<B>(
        [&s, per_expert_gemm, hand_back, per_expert, h, f, w2 = w.fc2.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_forward(e, per_expert, f, h, s.act + row * f, w2 + x * h * f,
                              s.expert_out + row * h);
          });
          hand_back(s.expert_out, s.expert_out_src, s.tp_send, e);
        });
  }
  if (op == "fwd.combine_a2a") {
    return all_to_all(s.expert_out_src, s.recv_counts, s.combined, s.scratch_counts);
  }
  if (op == "fwd.unpermute") {
    return computation<B>([&s, sh, y = io.y](const Exec& e) {
      B::moe_unpermute(e, sh, s.routing(), s.unpermute_read, y);
    });
  }
  // ---- backward ----
  if (op == "bwd.unpermute") {
    return computation<B>([&s, sh, dy = io.dy](const Exec& e) {
      B::moe_unpermute_backward(e, sh, s.routing(), dy, s.unpermute_read, s.d_combined, s.dgate);
    });
  }
  if (op == "bwd.combine_a2a") {
    BoundOp bound = all_to_all(s.d_combined, s.send_counts, s.d_expert_out_src, s.scratch_counts);
    bound.after_collective = [&s, regroup](const Exec& e) {
      regroup(s.d_expert_out_src, s.d_expert_out, true, e);
    };
    return bound;
  }
  if (op == "bwd.grouped_fc2_dgrad") {
    return computation<B>(
        [&s, per_expert_gemm, per_expert, h, f, w2 = w.fc2.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_dgrad(e, per_expert, f, h, s.experts_grad + row * h, w2 + x * h * f,
                            s.d_act + row * f);
          });
        });
  }
  if (op == "bwd.grouped_fc2_wgrad") {
    return computation<B>(
        [&s, per_expert_gemm, per_expert, h, f, dw2 = w.fc2.gradient](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_wgrad_accumulate(e, per_expert, f, h, s.experts_grad + row * h,
                                       s.act + row * f, dw2 + x * h * f);
          });
        });
  }
  if (op == "bwd.swiglu") {
    return computation<B>([&s, gemm_rows, f](const Exec& e) {
      B::swiglu_backward(e, gemm_rows, f, s.fc1_out, s.d_act, s.d_fc1);
    });
  }
  if (op == "bwd.grouped_fc1_dgrad") {
    return computation<B>(
        [&s, per_expert_gemm, hand_back, per_expert, h, f, w1 = w.fc1.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_dgrad(e, per_expert, h, 2 * f, s.d_fc1 + row * 2 * f, w1 + x * 2 * f * h,
                            s.d_expert_in + row * h);
          });
          hand_back(s.d_expert_in, s.d_expert_in_src, s.d_tp_send, e);
        });
  }
  if (op == "bwd.grouped_fc1_wgrad") {
    return computation<B>(
        [&s, per_expert_gemm, per_expert, h, f, dw1 = w.fc1.gradient](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            B::linear_wgrad_accumulate(e, per_expert, h, 2 * f, s.d_fc1 + row * 2 * f,
                                       s.experts_read + row * h, dw1 + x * 2 * f * h);
          });
        });
  }
  if (op == "bwd.dispatch_a2a") {
    return all_to_all(s.d_expert_in_src, s.recv_counts, s.d_permuted, s.scratch_counts);
  }
  if (op == "bwd.permute") {
    return computation<B>([&s, sh](const Exec& e) {
      B::moe_permute_backward(e, sh, s.routing(), s.permute_grad, s.d_from_permute);
    });
  }
  if (op == "bwd.router") {
    return computation<B>([&s, sh, wr = w.router.compute, scale = loss_scale_](const Exec& e) {
      // This micro-batch's aux loss has the weight of its mean cross-entropy.
      const float aux_dloss = *scale * static_cast<float>(sh.tokens);
      B::moe_router_logits_backward(e, sh, s.routing(), s.dgate, aux_dloss, s.dz);
      B::linear_dgrad(e, sh.tokens, sh.hidden, sh.experts, s.dz, wr, s.d_from_router);
    });
  }
  if (op == "bwd.router_wgrad") {
    return computation<B>([&s, sh, x = io.x, dwr = w.router.gradient](const Exec& e) {
      B::linear_wgrad_accumulate(e, sh.tokens, sh.hidden, sh.experts, s.dz, x, dwr);
    });
  }
  return std::nullopt;
}

template <class B>
typename PaddedMoeLayers<B>::BoundOp::Task PaddedMoeLayers<B>::sum_input_gradient(
    int64_t layer, int64_t micro_batch, const Io& io, bool recomputing) {
  State& s = state(micro_batch, layer, recomputing);
  // + the shared expert's through its fc1, then through its gate (the CPU's order).
  std::pair<const A*, const A*> shared{nullptr, nullptr};
  if (shared_) shared = shared_->input_gradients(layer, micro_batch, recomputing);
  return [&s, dx = io.dx, n = shape_.tokens * shape_.hidden, shared](const typename B::Exec& e) {
    B::add_tensors(e, n, s.d_from_permute, s.d_from_router, dx);
    if (shared.first == nullptr) return;
    B::add_tensors(e, n, dx, shared.first, dx);
    B::add_tensors(e, n, dx, shared.second, dx);
  };
}

template <class B>
std::vector<typename PaddedMoeLayers<B>::ParameterView> PaddedMoeLayers<B>::parameters(
    int64_t layer) {
  Weights& w = *weights_.at(layer);
  // As the CPU's: under TP every rank routes its own rows, so the router's gradient is
  // summed over TP, and so are the experts' when every TP rank holds whole experts (etp =
  // 1); with etp = tp each holds a slice whose gradient already covers the group's rows.
  const bool router_over_tp = tp_ > 1, experts_over_tp = tp_ > 1 && etp_ == 1;
  auto view = [](model_detail::Parameter<B>& p, bool over_tp, bool expert) {
    return ParameterView{p.name, p.values, p.gradient, p.compute, p.count, over_tp, expert, false};
  };
  std::vector<ParameterView> views = {view(w.router, router_over_tp, false),
                                      view(w.fc1, experts_over_tp, true),
                                      view(w.fc2, experts_over_tp, true)};
  if (shared_) {
    for (ParameterView& v : shared_->parameters(layer)) views.push_back(std::move(v));
  }
  return views;
}

template <class B>
void PaddedMoeLayers<B>::set_arena(ActivationArena<typename B::Memory>* arena) {
  buffers_.set_arena(arena);
  if (shared_) shared_->set_arena(arena);
}

template <class B>
void PaddedMoeLayers<B>::drop_states() {
  states_.clear();
  recompute_states_.clear();
  if (shared_) shared_->drop_states();
}

template <class B>
float PaddedMoeLayers<B>::aux_loss_sum(int64_t micro_batches) {
  float sum = 0.0f;
  for (const auto& [key, s] : states_) {
    if (key.first >= micro_batches) continue;
    float aux = 0.0f;
    memory_.download(s->aux, &aux, 1);
    sum += aux;
  }
  return sum;
}

template <class B>
int64_t PaddedMoeLayers<B>::dropped_copies() {
  const int64_t assignments = shape_.tokens * shape_.top_k;
  std::vector<uint8_t> kept(moe_padded_detail::padded_size(assignments));
  int64_t dropped = 0;
  for (const auto& [key, s] : states_) {
    memory_.download(s->kept, kept.data(), assignments);
    for (uint8_t flag : kept) dropped += flag == 0 ? 1 : 0;
  }
  return dropped;
}

/// A backend with the padded MoE kernels binds its MoE layers with PaddedMoeLayers
/// (moe_layers_of.h).
template <PaddedMoeBackend B>
struct MoeLayersOf<B> {
  using type = PaddedMoeLayers<B>;
  using Io = PaddedMoeIo<typename B::Act>;
  static std::unique_ptr<PaddedMoeLayers<B>> make(const JobSpec& job, int64_t rank,
                                                  const std::vector<int64_t>& layers, uint64_t seed,
                                                  const float* loss_scale,
                                                  typename B::Memory& memory) {
    return std::make_unique<PaddedMoeLayers<B>>(job, rank, layers, seed, loss_scale, memory);
  }
};

}  // namespace dhelix::rt

#include "runtime/model/moe_expert_tp_padded.h"     // IWYU pragma: keep (bind_expert_tp)
#include "runtime/model/moe_layers_padded_state.h"  // IWYU pragma: keep (State, state)
