#pragma once
// The shared expert of a MoE layer on a device backend (Qwen2-MoE; ModelSpec's
// shared_expert_ffn_hidden_size), bound to the plan's shared-expert ops (kSharedOps,
// lib/dag_builder_shared_expert.cc) exactly as runtime/model/moe_shared_expert_cpu.cc binds
// them on the CPU (read its opening comment: the same data flow, op for op):
//
//   y += g * fc2(swiglu(fc1(x))),  g = sigmoid(x w_g) per token
//
//   tp = 1   fwd.shared_fc2 runs the gate (logit GEMM, g, y += g out);
//            bwd.shared_fc2_dgrad its backward; bwd.shared_fc2_wgrad scales dy by g itself
//            (it may run before the dgrad)
//   tp > 1   fwd.allgather_shared gathers the TP group's T = tp N rows; fc1 column- and fc2
//            row-parallel on them; fwd.shared_fc1 computes g on the own N rows;
//            fwd.reduce_scatter_shared sums the partial outputs back to N rows and its local
//            step adds g out to y; bwd.allgather_shared first forms d out = g dy and d logit
//            on the own rows, then gathers d out; bwd.reduce_scatter_shared sums fc1's input
//            gradient back to the own rows
//
// Unlike the routed experts nothing here depends on the routing, so every buffer has its
// host-known size without padding. The GEMMs are the backend's linear_* (the gate's h -> 1
// product and its two backward products with out = 1, on the own N rows); the gate's
// element and row steps are the backend's moe_shared_gate* (runtime/cuda/moe_shared_cuda.h,
// the math of runtime/kernels/moe_shared_gate.h): logit and d logit are activations (Act,
// the GEMMs' output and input), g fp32.
//
// Weights (the CPU's, with its initial values: the TP slices of the whole tensors):
// gate [h] (replicated; its gradient summed over TP when tp > 1), fc1 [2 Fs/tp, h] (this
// rank's gate rows, then its up rows), fc2 [h, Fs/tp]. Buffers per (micro-batch, layer,
// recomputing): full activation recompute's repeated forward and the backward of such a
// job use a second set, as the CPU's recompute_states_.

#include <fmt/format.h>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/job_spec.h"
#include "lib/rank_shape.h"
#include "runtime/model/moe_op_names.h"
#include "runtime/model/moe_padded_buffers.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {

/// What a backend provides for PaddedSharedExpert beyond the dense kernels: the gate steps
/// of runtime/cuda/moe_shared_cuda.h (same arguments, the Exec first).
template <class B>
concept PaddedSharedExpertBackend = requires(const typename B::Exec& e, const typename B::Act* in,
                                             typename B::Act* out, const float* gate,
                                             float* gate_out) {
  B::moe_shared_gate(e, int64_t{1}, in, gate_out);
  B::moe_shared_gate_add(e, int64_t{1}, int64_t{1}, gate, in, out);
  B::moe_shared_gate_scale(e, int64_t{1}, int64_t{1}, gate, in, out);
  B::moe_shared_gate_backward(e, int64_t{1}, int64_t{1}, gate, in, in, out, out);
};

template <class A>
struct PaddedMoeIo;  // moe_layers_padded.h

template <class B>
class PaddedSharedExpert {
 public:
  using A = typename B::Act;
  using Io = PaddedMoeIo<A>;
  using BoundOp = BasicBoundOp<B>;
  using ParameterView = BasicParameterView<B>;

  /// The shared experts of `layers` on world rank `rank` of `job` (whose model has one, of
  /// a width tp divides, with SP under TP: runtime/train/moe_support.h refuses the rest),
  /// buffers from `memory` (which must outlive this).
  PaddedSharedExpert(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers,
                     uint64_t seed, typename B::Memory& memory);

  /// True for the shared expert's op ids (kSharedOps).
  static bool handles(const std::string& op) { return names_op(kSharedOps, op); }
  /// Binds `op` of (micro_batch, layer); nullopt when `op` is not one of handles(). A TP
  /// exchange with tp = 1 is Error(kInvalidInput) (the planner writes none).
  std::optional<BoundOp> bind(const std::string& op, int64_t layer, int64_t micro_batch,
                              const Io& io, bool recomputing);
  /// The two input gradients [N, h] the MLP's input receives, in the order the CPU adds
  /// them: through fc1, then through the gate.
  std::pair<const A*, const A*> input_gradients(int64_t layer, int64_t micro_batch,
                                                bool recomputing);
  /// `layer`'s ".shared_gate", ".shared_fc1", ".shared_fc2" (none expert).
  std::vector<ParameterView> parameters(int64_t layer);
  /// Buffers from the stage model's activation arena from now on (moe_padded_buffers.h).
  void set_arena(ActivationArena<typename B::Memory>* arena) { buffers_.set_arena(arena); }
  /// Forgets every state (the arena's layout pass bound them with fake addresses).
  void drop_states() { states_.clear(); }

 private:
  struct Weights {
    model_detail::Parameter<B> gate, fc1, fc2;
  };
  struct State {
    A *x_all = nullptr, *out_all = nullptr, *d_out_all = nullptr, *d_x_all = nullptr;  // [T, h]
    A *fc1 = nullptr, *d_fc1 = nullptr;                                                // [T, 2fs]
    A *act = nullptr, *d_act = nullptr;                                                // [T, fs]
    A *out = nullptr, *d_out = nullptr, *d_out_w = nullptr;                            // [N, h]
    A *d_from_shared = nullptr, *d_from_gate = nullptr;                                // [N, h]
    A *logit = nullptr, *d_logit = nullptr;                                            // [N]
    float* gate = nullptr;                                                             // [N]
  };
  State& state(int64_t micro_batch, int64_t layer, bool recomputing);

  int64_t rows_ = 0;    // N: the rank's own rows
  int64_t hidden_ = 0;  // h
  int64_t tp_ = 1;
  int64_t ffn_ = 0;  // fs = Fs / tp: this rank's width
  typename B::Memory& memory_;
  PaddedMoeBuffers<typename B::Memory> buffers_;
  std::map<int64_t, Weights> weights_;
  std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<State>> states_;
};

template <class B>
PaddedSharedExpert<B>::PaddedSharedExpert(const JobSpec& job, int64_t rank,
                                          const std::vector<int64_t>& layers, uint64_t seed,
                                          typename B::Memory& memory)
    : memory_(memory),
      buffers_(memory, job.parallel.recompute.granularity == RecomputeGranularity::kFull) {
  const RankShape dims = rank_shape(job, rank);
  const int64_t full_fs = job.model.moe->shared_expert_ffn_hidden_size;
  DHELIX_CHECK(full_fs > 0 && full_fs % dims.tp == 0);
  DHELIX_CHECK(dims.tp == 1 || dims.sp);  // the planner refuses MoE under TP without SP
  rows_ = dims.rows;
  hidden_ = dims.hidden;
  tp_ = dims.tp;
  ffn_ = full_fs / tp_;
  // moe_layers_cpu.cc's values: one expert of width Fs cut as expert tensor parallelism cuts
  // the routed ones (fc1's gate rows [r fs, +fs) and up rows Fs + the same, fc2's columns
  // [r fs, +fs)), element for element of the whole tensors.
  const int64_t h = hidden_;
  const model_detail::ExpertSlice slice{.first = 0,
                                        .local = 1,
                                        .hidden = h,
                                        .ffn = ffn_,
                                        .full_ffn = full_fs,
                                        .etp_rank = dims.tp_rank};
  const float bound_h = 1.0f / std::sqrt(static_cast<float>(h));
  const float bound_f = 1.0f / std::sqrt(static_cast<float>(full_fs));
  for (int64_t layer : layers) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    auto place = [&](const std::string& name, std::vector<float> values) {
      return model_detail::place_parameter<B>(
          memory_, model_detail::HostTensor{prefix + name, std::move(values), false});
    };
    std::vector<float> gate(static_cast<size_t>(h));
    for (int64_t i = 0; i < h; ++i) {
      gate[static_cast<size_t>(i)] =
          model_detail::init_uniform(seed, prefix + "shared_gate", i, bound_h);
    }
    Weights& w = weights_[layer];
    w.gate = place("shared_gate", std::move(gate));
    w.fc1 = place("shared_fc1", model_detail::expert_fc1_initial_values(seed, prefix + "shared_fc1",
                                                                        slice, bound_h));
    w.fc2 = place("shared_fc2", model_detail::expert_fc2_initial_values(seed, prefix + "shared_fc2",
                                                                        slice, bound_f));
  }
}

template <class B>
typename PaddedSharedExpert<B>::State& PaddedSharedExpert<B>::state(int64_t micro_batch,
                                                                    int64_t layer,
                                                                    bool recomputing) {
  std::unique_ptr<State>& slot = states_[{micro_batch, layer, recomputing}];
  if (slot) return *slot;
  slot = std::make_unique<State>();
  State& s = *slot;
  // The CPU's spans (moe_layers_cpu.cc), none of it counted by the plan.
  typename PaddedMoeBuffers<typename B::Memory>::Scope m(buffers_, micro_batch, layer, recomputing);
  const int64_t n = rows_, t = rows_ * tp_, h = hidden_, fs = ffn_;
  s.fc1 = m.template forward<A>("s_fc1", t * 2 * fs);
  s.d_fc1 = m.template backward<A>("s_d_fc1", t * 2 * fs);
  s.act = m.template forward<A>("s_act", t * fs);
  s.d_act = m.template backward<A>("s_d_act", t * fs);
  if (tp_ > 1) {
    s.x_all = m.template forward<A>("s_x_all", t * h);
    s.out_all = m.template forward<A>("s_out_all", t * h);
    s.d_out_all = m.template backward<A>("s_d_out_all", t * h);
    s.d_x_all = m.template backward<A>("s_d_x_all", t * h);
  }
  s.out = m.template forward<A>("s_out", n * h);
  for (auto [buffer, name] :
       {std::pair{&s.d_out, "s_d_out"}, std::pair{&s.d_out_w, "s_d_out_w"},
        std::pair{&s.d_from_shared, "d_from_shared"}, std::pair{&s.d_from_gate, "d_from_gate"}}) {
    *buffer = m.template backward<A>(name, n * h);
  }
  s.logit = m.template forward<A>("s_logit", n);
  s.d_logit = m.template backward<A>("s_d_logit", n);
  s.gate = m.template forward<float>("s_gate", n);
  return s;
}

template <class B>
std::optional<typename PaddedSharedExpert<B>::BoundOp> PaddedSharedExpert<B>::bind(
    const std::string& op, int64_t layer, int64_t micro_batch, const Io& io, bool recomputing) {
  using Exec = typename B::Exec;
  using model_detail::collective;
  using model_detail::communication;
  using model_detail::computation;
  if (!handles(op)) return std::nullopt;
  check_shared_expert_op(op, tp_);
  State& s = state(micro_batch, layer, recomputing);
  Weights& w = weights_.at(layer);
  // n own rows; t rows the GEMMs see (the TP group's with tp > 1); fs this rank's width.
  const int64_t n = rows_, t = rows_ * tp_, h = hidden_, fs = ffn_;
  const bool tp = tp_ > 1;
  const A* x_all = tp ? s.x_all : io.x;  // the rows fc1 reads
  // logit = x w_g and g = sigmoid(logit) on the own rows.
  auto gate_forward = [&s, n, h, x = io.x, wg = w.gate.compute](const Exec& e) {
    B::linear_forward(e, n, h, 1, x, wg, s.logit);
    B::moe_shared_gate(e, n, s.logit, s.gate);
  };
  auto gate_backward = [&s, n, h, dy = io.dy](const Exec& e) {
    B::moe_shared_gate_backward(e, n, h, s.gate, dy, s.out, s.d_logit, s.d_out);
  };
  // ---- forward ----
  if (op == "fwd.allgather_shared") {
    return communication<B>(collective(CollectiveKind::kAllGather, io.x, s.x_all, n * h));
  }
  if (op == "fwd.shared_fc1") {
    return computation<B>(
        [&s, t, h, fs, tp, x_all, gate_forward, w1 = w.fc1.compute](const Exec& e) {
          B::linear_forward(e, t, h, 2 * fs, x_all, w1, s.fc1);
          if (tp) gate_forward(e);
        });
  }
  if (op == "fwd.shared_swiglu") {
    return computation<B>(
        [&s, t, fs](const Exec& e) { B::swiglu_forward(e, t, fs, s.fc1, s.act); });
  }
  if (op == "fwd.shared_fc2") {
    return computation<B>(
        [&s, n, t, h, fs, tp, gate_forward, y = io.y, w2 = w.fc2.compute](const Exec& e) {
          B::linear_forward(e, t, fs, h, s.act, w2, tp ? s.out_all : s.out);
          if (tp) return;  // fwd.reduce_scatter_shared adds it
          gate_forward(e);
          B::moe_shared_gate_add(e, n, h, s.gate, s.out, y);
        });
  }
  if (op == "fwd.reduce_scatter_shared") {
    BoundOp bound =
        communication<B>(collective(CollectiveKind::kReduceScatter, s.out_all, s.out, n * h));
    bound.after_collective = [&s, n, h, y = io.y](const Exec& e) {
      B::moe_shared_gate_add(e, n, h, s.gate, s.out, y);
    };
    return bound;
  }
  // ---- backward ----
  A* d_out_all = tp ? s.d_out_all : s.d_out;  // what the GEMMs read
  if (op == "bwd.allgather_shared") {
    BoundOp bound =
        communication<B>(collective(CollectiveKind::kAllGather, s.d_out, s.d_out_all, n * h));
    bound.before_collective = gate_backward;
    return bound;
  }
  if (op == "bwd.shared_fc2_dgrad") {
    return computation<B>([&s, n, t, h, fs, tp, d_out_all, gate_backward, x = io.x,
                           w2 = w.fc2.compute, wg = w.gate.compute,
                           dwg = w.gate.gradient](const Exec& e) {
      if (!tp) gate_backward(e);  // tp > 1: bwd.allgather_shared did it
      B::linear_dgrad(e, t, fs, h, d_out_all, w2, s.d_act);
      B::linear_dgrad(e, n, h, 1, s.d_logit, wg, s.d_from_gate);
      B::linear_wgrad_accumulate(e, n, h, 1, s.d_logit, x, dwg);
    });
  }
  if (op == "bwd.shared_fc2_wgrad") {
    return computation<B>(
        [&s, n, t, h, fs, tp, d_out_all, dy = io.dy, dw2 = w.fc2.gradient](const Exec& e) {
          if (tp) {
            B::linear_wgrad_accumulate(e, t, fs, h, d_out_all, s.act, dw2);
            return;
          }
          // tp = 1: may run before the dgrad, so it scales dy itself.
          B::moe_shared_gate_scale(e, n, h, s.gate, dy, s.d_out_w);
          B::linear_wgrad_accumulate(e, n, fs, h, s.d_out_w, s.act, dw2);
        });
  }
  if (op == "bwd.shared_swiglu") {
    return computation<B>(
        [&s, t, fs](const Exec& e) { B::swiglu_backward(e, t, fs, s.fc1, s.d_act, s.d_fc1); });
  }
  if (op == "bwd.shared_fc1_dgrad") {
    return computation<B>(
        [&s, t, h, fs, d_x = tp ? s.d_x_all : s.d_from_shared, w1 = w.fc1.compute](const Exec& e) {
          B::linear_dgrad(e, t, h, 2 * fs, s.d_fc1, w1, d_x);
        });
  }
  if (op == "bwd.reduce_scatter_shared") {
    return communication<B>(
        collective(CollectiveKind::kReduceScatter, s.d_x_all, s.d_from_shared, n * h));
  }
  if (op == "bwd.shared_fc1_wgrad") {
    return computation<B>([&s, t, h, fs, x_all, dw1 = w.fc1.gradient](const Exec& e) {
      B::linear_wgrad_accumulate(e, t, h, 2 * fs, s.d_fc1, x_all, dw1);
    });
  }
  return std::nullopt;
}

template <class B>
std::pair<const typename B::Act*, const typename B::Act*> PaddedSharedExpert<B>::input_gradients(
    int64_t layer, int64_t micro_batch, bool recomputing) {
  DHELIX_CHECK(weights_.contains(layer));
  State& s = state(micro_batch, layer, recomputing);
  return {s.d_from_shared, s.d_from_gate};
}

template <class B>
std::vector<typename PaddedSharedExpert<B>::ParameterView> PaddedSharedExpert<B>::parameters(
    int64_t layer) {
  Weights& w = weights_.at(layer);
  auto view = [](model_detail::Parameter<B>& p, bool over_tp) {
    return ParameterView{p.name, p.values, p.gradient, p.compute, p.count, over_tp, false, false};
  };
  // The gate is replicated and sees the rank's own rows; fc1 and fc2 are TP slices whose
  // gradients cover the gathered rows.
  return {view(w.gate, tp_ > 1), view(w.fc1, false), view(w.fc2, false)};
}

}  // namespace dhelix::rt
