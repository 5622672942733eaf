// The shared expert of a CPU MoE layer (Qwen2-MoE; lib/dag_builder_shared_expert.cc): a
// dense SwiGLU MLP every token passes, its output scaled by a per-token sigmoid gate
// sigmoid(x w_g) and added to the routed experts' output y:
//
//   y += g * fc2(swiglu(fc1(x))),  g = sigmoid(x w_g)
//   backward  dg = <dy, out>, dlogit = dg g (1 - g); d out = g dy;
//             dx += fc1's dx + dlogit w_g
//
// tp = 1: no communication; fwd.shared_fc2 also runs the gate (the planner leaves the
// h -> 1 GEMM out of its costs) and bwd.shared_fc2_dgrad its backward.
//
// tp > 1 (with SP, as the planner requires for MoE): Megatron-Core's SharedExpertMLP is
// tensor-parallel like a dense MLP. The plan's fwd.allgather_shared gathers the TP group's
// rows x (T = tp N of them); fc1 is column-parallel (this rank's Fs/tp gate rows and up
// rows), fc2 row-parallel, and fwd.reduce_scatter_shared sums the partial outputs back to
// the rank's N rows, where its local step scales them by the gate and adds them to y. The
// gate (replicated, its gradient summed over TP) is computed on the rank's own rows in
// fwd.shared_fc1. Backward: bwd.allgather_shared first forms d out = g dy and d(logit) on
// the own rows, then gathers d out; the GEMMs run on the T rows, and
// bwd.reduce_scatter_shared sums fc1's input gradient back to the own rows.

#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/moe_shared_gate.h"
#include "runtime/model/moe_layers_cpu_internal.h"
#include "runtime/model/moe_op_names.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {
namespace {

using moe_detail::to_size;

// y[r] += g[r] * out[r] for n rows of h.
void add_gated(int64_t n, int64_t h, const ArenaFloats& gate, const float* out, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    kernels::shared_gate_add_row(h, gate[to_size(r)], out + r * h, y + r * h);
  }
}

// The gate's backward on n rows: d_logit = <dy, out> g (1 - g) and d_out = g dy.
void gate_backward(int64_t n, int64_t h, const float* dy, const float* out, const ArenaFloats& gate,
                   float* d_logit, float* d_out) {
  for (int64_t r = 0; r < n; ++r) {
    d_logit[r] = kernels::shared_gate_backward_row(h, gate[to_size(r)], dy + r * h, out + r * h,
                                                   d_out + r * h);
  }
}

// logit = x w_g and g = sigmoid(logit) on n rows.
void gate_forward(int64_t n, int64_t h, const float* x, const float* wg, const ArenaFloats& logit,
                  const ArenaFloats& gate) {
  cpu::linear_forward(n, h, 1, x, wg, logit.data());
  for (int64_t r = 0; r < n; ++r) gate[to_size(r)] = kernels::shared_gate(logit[to_size(r)]);
}

}  // namespace

std::optional<BoundOp> MoeLayersCpu::bind_shared(const std::string& op, int64_t layer,
                                                 int64_t micro_batch, const MoeLayerIo& io,
                                                 bool recomputing) {
  using model_detail::computation;
  if (shared_ffn_ == 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {}: the model has no shared expert", op));
  }
  check_shared_expert_op(op, tp_);
  State& s = state(micro_batch, layer, recomputing);
  Weights& w = *weights_.at(layer);
  // n own rows; t rows the GEMMs see (the TP group's with tp > 1); fs this rank's width.
  const int64_t n = shape_.tokens, t = n * tp_, h = shape_.hidden, fs = shared_ffn_ / tp_;
  const bool tp = tp_ > 1;
  const float* x_all = tp ? s.s_x_all.data() : io.x;  // the rows fc1 reads
  // ---- forward ----
  if (op == "fwd.allgather_shared") {
    return model_detail::communication<CpuBackend>(
        model_detail::collective(CollectiveKind::kAllGather, io.x, s.s_x_all.data(), n * h));
  }
  if (op == "fwd.shared_fc1") {
    return computation<CpuBackend>([&s, n, t, h, fs, tp, x = io.x, x_all, w1 = w.shared_fc1.data(),
                                    wg = w.shared_gate.data()](const auto&) {
      cpu::linear_forward(t, h, 2 * fs, x_all, w1, s.s_fc1.data());
      if (tp) gate_forward(n, h, x, wg, s.s_logit, s.s_gate);
    });
  }
  if (op == "fwd.shared_swiglu") {
    return computation<CpuBackend>(
        [&s, t, fs](const auto&) { cpu::swiglu_forward(t, fs, s.s_fc1.data(), s.s_act.data()); });
  }
  if (op == "fwd.shared_fc2") {
    return computation<CpuBackend>([&s, n, t, h, fs, tp, x = io.x, y = io.y,
                                    w2 = w.shared_fc2.data(),
                                    wg = w.shared_gate.data()](const auto&) {
      cpu::linear_forward(t, fs, h, s.s_act.data(), w2, tp ? s.s_out_all.data() : s.s_out.data());
      if (tp) return;  // fwd.reduce_scatter_shared adds it
      gate_forward(n, h, x, wg, s.s_logit, s.s_gate);
      add_gated(n, h, s.s_gate, s.s_out.data(), y);
    });
  }
  if (op == "fwd.reduce_scatter_shared") {
    BoundOp bound = model_detail::communication<CpuBackend>(model_detail::collective(
        CollectiveKind::kReduceScatter, s.s_out_all.data(), s.s_out.data(), n * h));
    bound.after_collective = [&s, n, h, y = io.y](const auto&) {
      add_gated(n, h, s.s_gate, s.s_out.data(), y);
    };
    return bound;
  }
  // ---- backward ----
  float* d_out_all = tp ? s.s_d_out_all.data() : s.s_d_out.data();  // what the GEMMs read
  if (op == "bwd.allgather_shared") {
    BoundOp bound = model_detail::communication<CpuBackend>(model_detail::collective(
        CollectiveKind::kAllGather, s.s_d_out.data(), s.s_d_out_all.data(), n * h));
    bound.before_collective = [&s, n, h, dy = io.dy](const auto&) {
      gate_backward(n, h, dy, s.s_out.data(), s.s_gate, s.s_d_logit.data(), s.s_d_out.data());
    };
    return bound;
  }
  if (op == "bwd.shared_fc2_dgrad") {
    return computation<CpuBackend>([&s, n, t, h, fs, tp, d_out_all, x = io.x, dy = io.dy,
                                    w2 = w.shared_fc2.data(), wg = w.shared_gate.data(),
                                    dwg = w.d_shared_gate.data()](const auto&) {
      if (!tp) {  // tp > 1: bwd.allgather_shared did it
        gate_backward(n, h, dy, s.s_out.data(), s.s_gate, s.s_d_logit.data(), s.s_d_out.data());
      }
      cpu::linear_dgrad(t, fs, h, d_out_all, w2, s.s_d_act.data());
      cpu::linear_dgrad(n, h, 1, s.s_d_logit.data(), wg, s.d_from_gate.data());
      cpu::linear_wgrad_accumulate(n, h, 1, s.s_d_logit.data(), x, dwg);
    });
  }
  if (op == "bwd.shared_fc2_wgrad") {
    return computation<CpuBackend>(
        [&s, n, t, h, fs, tp, d_out_all, dy = io.dy, dw2 = w.d_shared_fc2.data()](const auto&) {
          if (tp) {
            cpu::linear_wgrad_accumulate(t, fs, h, d_out_all, s.s_act.data(), dw2);
            return;
          }
          // tp = 1: may run before the dgrad, so it scales dy itself.
          for (int64_t r = 0; r < n; ++r) {
            kernels::shared_gate_scale_row(h, s.s_gate[to_size(r)], dy + r * h,
                                           s.s_d_out_w.data() + r * h);
          }
          cpu::linear_wgrad_accumulate(n, fs, h, s.s_d_out_w.data(), s.s_act.data(), dw2);
        });
  }
  if (op == "bwd.shared_swiglu") {
    return computation<CpuBackend>([&s, t, fs](const auto&) {
      cpu::swiglu_backward(t, fs, s.s_fc1.data(), s.s_d_act.data(), s.s_d_fc1.data());
    });
  }
  if (op == "bwd.shared_fc1_dgrad") {
    return computation<CpuBackend>([&s, t, h, fs,
                                    d_x = tp ? s.s_d_x_all.data() : s.d_from_shared.data(),
                                    w1 = w.shared_fc1.data()](const auto&) {
      cpu::linear_dgrad(t, h, 2 * fs, s.s_d_fc1.data(), w1, d_x);
    });
  }
  if (op == "bwd.reduce_scatter_shared") {
    return model_detail::communication<CpuBackend>(model_detail::collective(
        CollectiveKind::kReduceScatter, s.s_d_x_all.data(), s.d_from_shared.data(), n * h));
  }
  if (op == "bwd.shared_fc1_wgrad") {
    return computation<CpuBackend>([&s, t, h, fs, x_all, dw1 = w.d_shared_fc1.data()](const auto&) {
      cpu::linear_wgrad_accumulate(t, h, 2 * fs, s.s_d_fc1.data(), x_all, dw1);
    });
  }
  return std::nullopt;
}

}  // namespace dhelix::rt
