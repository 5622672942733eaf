#include "runtime/model/moe_layers_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/swiglu.h"
#include "runtime/model/moe_layers_cpu_internal.h"
#include "runtime/model/moe_op_names.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {

using moe_detail::rows_of;
using moe_detail::to_size;

MoeLayersCpu::MoeLayersCpu(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers,
                           uint64_t seed, const float* loss_scale)
    : loss_scale_(loss_scale),
      full_recompute_(job.parallel.recompute.granularity == RecomputeGranularity::kFull) {
  const MoeSpec& moe = *job.model.moe;
  const RankShape dims = rank_shape(job, rank);
  // With tp > 1 the MoE layer works on the rank's sequence-parallel rows (N = T / tp), and
  // with expert tensor parallelism each TP rank holds 1/etp of every expert's FFN.
  DHELIX_CHECK(dims.tp == 1 || dims.sp);  // the planner refuses MoE under TP without SP
  // moe_support.h refuses a shared expert whose width tp does not divide.
  DHELIX_CHECK(moe.shared_expert_ffn_hidden_size % dims.tp == 0);
  tp_ = dims.tp;
  etp_ = job.parallel.expert_tp_size();
  DHELIX_CHECK(etp_ == 1 || etp_ == tp_);
  DHELIX_CHECK(moe.expert_ffn_hidden_size % etp_ == 0);
  const int64_t etp_rank = etp_ > 1 ? dims.tp_rank : 0;
  shape_ = cpu::MoeLayerShape{.tokens = dims.rows,
                              .hidden = dims.hidden,
                              .experts = moe.num_experts,
                              .top_k = moe.top_k,
                              .ffn = moe.expert_ffn_hidden_size / etp_,
                              .capacity_factor = moe.capacity_factor,
                              .aux_loss_coeff = moe.aux_loss_weight()};
  ep_ = job.parallel.ep;
  shared_ffn_ = moe.shared_expert_ffn_hidden_size;
  DHELIX_CHECK(moe.num_experts % ep_ == 0);
  local_ = moe.num_experts / ep_;
  ep_rank_ = Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).ep;
  const int64_t h = shape_.hidden, f = shape_.ffn, e_all = shape_.experts;
  const int64_t first = ep_rank_ * local_;
  for (int64_t layer : layers) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    auto w = std::make_unique<Weights>();
    w->router.resize(to_size(e_all * h));
    const float router_bound = 1.0f / std::sqrt(static_cast<float>(h));
    for (int64_t i = 0; i < e_all * h; ++i) {
      w->router[to_size(i)] = model_detail::init_uniform(seed, prefix + "router", i, router_bound);
    }
    const model_detail::ExpertSlice slice{.first = first,
                                          .local = local_,
                                          .hidden = h,
                                          .ffn = f,
                                          .full_ffn = moe.expert_ffn_hidden_size,
                                          .etp_rank = etp_rank};
    w->fc1 =
        model_detail::expert_fc1_initial_values(seed, prefix + "experts_fc1", slice, router_bound);
    w->fc2 = model_detail::expert_fc2_initial_values(
        seed, prefix + "experts_fc2", slice,
        1.0f / std::sqrt(static_cast<float>(moe.expert_ffn_hidden_size)));
    if (shared_ffn_ > 0) {
      // Sliced over TP like a dense MLP: one expert of FFN width Fs cut as expert tensor
      // parallelism cuts the routed ones (fc1's gate rows [r fs, +fs) and up rows Fs + the
      // same, fc2's columns [r fs, +fs)), with the values of the whole tensors.
      const model_detail::ExpertSlice shared{.first = 0,
                                             .local = 1,
                                             .hidden = h,
                                             .ffn = shared_ffn_ / tp_,
                                             .full_ffn = shared_ffn_,
                                             .etp_rank = dims.tp_rank};
      w->shared_gate.resize(to_size(h));
      for (int64_t i = 0; i < h; ++i) {
        w->shared_gate[to_size(i)] =
            model_detail::init_uniform(seed, prefix + "shared_gate", i, router_bound);
      }
      w->shared_fc1 = model_detail::expert_fc1_initial_values(seed, prefix + "shared_fc1", shared,
                                                              router_bound);
      w->shared_fc2 = model_detail::expert_fc2_initial_values(
          seed, prefix + "shared_fc2", shared, 1.0f / std::sqrt(static_cast<float>(shared_ffn_)));
      w->d_shared_gate.assign(w->shared_gate.size(), 0.0f);
      w->d_shared_fc1.assign(w->shared_fc1.size(), 0.0f);
      w->d_shared_fc2.assign(w->shared_fc2.size(), 0.0f);
    }
    w->d_router.assign(w->router.size(), 0.0f);
    w->d_fc1.assign(w->fc1.size(), 0.0f);
    w->d_fc2.assign(w->fc2.size(), 0.0f);
    weights_.emplace(layer, std::move(w));
  }
}

MoeLayersCpu::~MoeLayersCpu() = default;

bool MoeLayersCpu::handles(const std::string& op) {
  return names_op(kRoutedMoeOps, op) || names_op(kExpertTpOps, op) || names_op(kSharedOps, op);
}

MoeLayersCpu::State& MoeLayersCpu::state(int64_t micro_batch, int64_t layer, bool recomputing) {
  std::unique_ptr<State>& slot = (recomputing ? recompute_states_ : states_)[{micro_batch, layer}];
  if (slot) return *slot;
  slot = std::make_unique<State>();
  State& s = *slot;
  const int64_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.top_k;
  const size_t copies = to_size(t * k), arrived = to_size(ep_ * t * k),
               gathered = to_size(etp_) * arrived, counts = to_size(ep_ * local_),
               tp_counts = to_size(etp_ * local_);
  s.send_counts.assign(counts, 0);
  s.recv_counts.assign(counts, 0);
  s.scratch_counts.assign(counts, 0);
  s.tp_send_counts.assign(tp_counts, 0);
  s.tp_recv_counts.assign(tp_counts, 0);
  s.tp_scratch_counts.assign(tp_counts, 0);
  s.local_rows.assign(to_size(local_), 0);
  s.gemm_rows.assign(to_size(local_), 0);
  // Spans (runtime/memory/buffer_spans.h): the forward's buffers live to the layer's
  // backward (all of them, conservatively), die with the forward in full recompute's first
  // pass and live in the backward for its repeat; gradient buffers live in the MLP block's
  // backward. What the plan counts of a layer's experts (planner/memory_model.h: per routed
  // copy the fc1 input, fc1's output and the activation, and the combine's input) is the
  // buffers the backward reads of those. The dispatched ones are sized at their bound, ep
  // times the balanced rows the plan counts (etp x N k of the etp x ep x N k reserved for
  // fc1's output and the activation, F / etp wide): the count takes 1/ep of them; of the
  // gathered fc1 input, 1/(etp x ep), the plan's sharded T k h / tp.
  const bool first_pass = full_recompute_ && !recomputing;
  const SpanKind fwd = recomputing  ? SpanKind::kLayerBackward
                       : first_pass ? SpanKind::kMlpForward
                                    : SpanKind::kLayerSaved;
  const SpanKind bwd = first_pass ? SpanKind::kMlpForward : SpanKind::kMlpBackward;
  const std::string prefix = recomputing ? "re.moe." : "moe.";
  const auto make = [&](SpanKind kind, const char* name, size_t n, int64_t share = 0) {
    const auto count = static_cast<int64_t>(n);
    float* data = nullptr;
    if (allocate_) {
      data = allocate_(kind, micro_batch, layer, prefix + name, count, first_pass ? 0 : share);
    } else {
      own_buffers_.push_back(std::make_unique<float[]>(std::max<size_t>(n, 1)));
      data = own_buffers_.back().get();
    }
    return ArenaFloats{data, n};
  };
  const bool ep = ep_ > 1, etp = etp_ > 1;
  const size_t hs = to_size(h);
  s.permuted = make(fwd, "permuted", copies * hs, !ep && !etp ? 1 : 0);
  s.combined = make(fwd, "combined", copies * hs, ep ? 1 : 0);
  s.d_combined = make(bwd, "d_combined", copies * hs);
  s.d_permuted = make(bwd, "d_permuted", copies * hs);
  s.dgate = make(bwd, "dgate", copies);
  s.received = make(fwd, "received", arrived * hs);
  s.expert_in = make(fwd, "expert_in", arrived * hs, ep && !etp ? ep_ : 0);
  s.expert_out_src = make(fwd, "expert_out_src", arrived * hs);
  s.d_expert_out_src = make(bwd, "d_expert_out_src", arrived * hs);
  s.d_expert_out = make(bwd, "d_expert_out", arrived * hs);
  s.d_expert_in_src = make(bwd, "d_expert_in_src", arrived * hs);
  s.expert_out = make(fwd, "expert_out", gathered * hs, !ep && !etp ? 1 : 0);
  s.d_expert_in = make(bwd, "d_expert_in", gathered * hs);
  if (etp) {
    s.tp_send = make(fwd, "tp_send", gathered * hs);
    s.tp_recv = make(fwd, "tp_recv", gathered * hs);
    s.gathered = make(fwd, "gathered", gathered * hs, etp_ * ep_);
    s.d_tp_send = make(bwd, "d_tp_send", gathered * hs);
    s.d_tp_recv = make(bwd, "d_tp_recv", gathered * hs);
    s.d_gathered = make(bwd, "d_gathered", gathered * hs);
    s.expert_own = make(fwd, "expert_own", arrived * hs, !ep ? 1 : 0);
    s.d_expert_own = make(bwd, "d_expert_own", arrived * hs);
  }
  s.fc1_out = make(fwd, "fc1_out", gathered * to_size(2 * f), ep_);
  s.d_fc1 = make(bwd, "d_fc1", gathered * to_size(2 * f));
  s.act = make(fwd, "act", gathered * to_size(f), ep_);
  s.d_act = make(bwd, "d_act", gathered * to_size(f));
  s.d_from_permute = make(bwd, "d_from_permute", to_size(t * h));
  s.d_from_router = make(bwd, "d_from_router", to_size(t * h));
  s.dz = make(bwd, "dz", to_size(t * shape_.experts));
  if (shared_ffn_ > 0) {  // moe_shared_expert_cpu.cc
    const size_t rows = to_size(t), all = to_size(t * tp_), fs = to_size(shared_ffn_ / tp_);
    s.s_fc1 = make(fwd, "s_fc1", all * 2 * fs);
    s.s_d_fc1 = make(bwd, "s_d_fc1", all * 2 * fs);
    s.s_act = make(fwd, "s_act", all * fs);
    s.s_d_act = make(bwd, "s_d_act", all * fs);
    if (tp_ > 1) {
      s.s_x_all = make(fwd, "s_x_all", all * hs);
      s.s_out_all = make(fwd, "s_out_all", all * hs);
      s.s_d_out_all = make(bwd, "s_d_out_all", all * hs);
      s.s_d_x_all = make(bwd, "s_d_x_all", all * hs);
    }
    s.s_out = make(fwd, "s_out", rows * hs);
    s.s_logit = make(fwd, "s_logit", rows);
    s.s_gate = make(fwd, "s_gate", rows);
    s.s_d_out = make(bwd, "s_d_out", rows * hs);
    s.s_d_out_w = make(bwd, "s_d_out_w", rows * hs);
    s.d_from_shared = make(bwd, "d_from_shared", rows * hs);
    s.d_from_gate = make(bwd, "d_from_gate", rows * hs);
    s.s_d_logit = make(bwd, "s_d_logit", rows);
  }
  s.own_in = ep ? s.expert_in.data() : s.permuted.data();
  s.experts_read = etp ? s.gathered.data() : s.own_in;
  s.own_out = etp ? s.expert_own.data() : s.expert_out.data();
  s.unpermute_read = ep ? s.combined.data() : s.own_out;
  s.own_grad = ep ? s.d_expert_out.data() : s.d_combined.data();
  s.experts_grad = etp ? s.d_gathered.data() : s.own_grad;
  s.own_in_grad = etp ? s.d_expert_own.data() : s.d_expert_in.data();
  s.permute_grad = ep ? s.d_permuted.data() : s.own_in_grad;
  return s;
}

std::optional<BoundOp> MoeLayersCpu::bind(const std::string& op, int64_t layer, int64_t micro_batch,
                                          const MoeLayerIo& io, bool recomputing) {
  using model_detail::computation;
  if (!handles(op)) return std::nullopt;
  if (op.find("shared") != std::string::npos) {
    return bind_shared(op, layer, micro_batch, io, recomputing);
  }
  if (op.find("etp_") != std::string::npos) {
    return bind_expert_tp(op, state(micro_batch, layer, recomputing));
  }
  const bool exchange = op.ends_with("_a2a");
  if (exchange && ep_ == 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {} does not occur with ep = 1", op));
  }
  State& s = state(micro_batch, layer, recomputing);
  Weights& w = *weights_.at(layer);
  const cpu::MoeLayerShape sh = shape_;
  const int64_t h = sh.hidden, f = sh.ffn, ep = ep_, local = local_;
  const int64_t arrived_capacity = ep * sh.tokens * sh.top_k * h;
  const int64_t copies_capacity = sh.tokens * sh.top_k * h;
  // An all-to-all over the EP group with L chunks per member.
  auto all_to_all = [&](const float* in, const std::vector<int64_t>& send, float* out,
                        std::vector<int64_t>& recv, int64_t capacity) {
    BoundOp bound;
    CollectiveRequest request =
        model_detail::collective(CollectiveKind::kAllToAllV, in, out, capacity);
    request.send_counts = send.data();
    request.recv_counts = recv.data();
    request.chunks = local;
    bound.collective = request;
    return bound;
  };
  // Per local expert e: fn(e, first row, rows).
  auto per_expert = [&s, local](auto&& fn) {
    int64_t row = 0;
    for (int64_t e = 0; e < local; ++e) {
      fn(e, row, s.gemm_rows[to_size(e)]);
      row += s.gemm_rows[to_size(e)];
    }
  };
  // After the last expert GEMM: its output (expert-major, the rows the experts computed
  // on) regrouped for the exchange that follows: by TP member for etp_reduce_scatter, else
  // by EP source for the all-to-all; without either the next op reads it where it is.
  auto hand_back = [&s, h, ep, etp = etp_, local](const float* out, float* ep_src, float* tp_src) {
    if (etp > 1) {
      moe_detail::regroup(etp, local, rows_of(s.tp_recv_counts, h), h, out, tp_src, false);
    } else if (ep > 1) {
      moe_detail::regroup(ep, local, rows_of(s.recv_counts, h), h, out, ep_src, false);
    }
  };
  auto total_rows = [&s] {
    int64_t rows = 0;
    for (int64_t n : s.gemm_rows) rows += n;
    return rows;
  };

  // ---- forward ----
  if (op == "fwd.router") {
    return computation<CpuBackend>([&s, sh, x = io.x, wr = w.router.data()](const auto&) {
      cpu::moe_route(sh, x, wr, s.routing);
    });
  }
  if (op == "fwd.permute") {
    return computation<CpuBackend>([&s, sh, x = io.x, h, ep, etp = etp_, local](const auto&) {
      cpu::moe_permute(sh, s.routing, x, s.permuted.data());
      for (int64_t i = 0; i < ep * local; ++i) {
        s.send_counts[to_size(i)] = s.routing.expert_rows[to_size(i)] * h;
      }
      if (ep == 1) {  // no dispatch: the local experts read the rank's own copies
        s.recv_counts = s.send_counts;
        for (int64_t e = 0; e < local; ++e)
          s.local_rows[to_size(e)] = s.send_counts[to_size(e)] / h;
        if (etp == 1) s.gemm_rows = s.local_rows;  // else etp_allgather sets them
      }
    });
  }
  if (op == "fwd.dispatch_a2a") {
    BoundOp bound = all_to_all(s.permuted.data(), s.send_counts, s.received.data(), s.recv_counts,
                               arrived_capacity);
    bound.after_collective = [&s, h, ep, etp = etp_, local](const auto&) {
      const std::vector<int64_t> rows = rows_of(s.recv_counts, h);
      for (int64_t e = 0; e < local; ++e) {
        s.local_rows[to_size(e)] = 0;
        for (int64_t src = 0; src < ep; ++src)
          s.local_rows[to_size(e)] += rows[to_size(src * local + e)];
      }
      if (etp == 1) s.gemm_rows = s.local_rows;  // else etp_allgather sets them
      moe_detail::regroup(ep, local, rows, h, s.received.data(), s.expert_in.data(), true);
    };
    return bound;
  }
  if (op == "fwd.grouped_fc1") {
    return computation<CpuBackend>([&s, per_expert, h, f, w1 = w.fc1.data()](const auto&) {
      per_expert([&](int64_t e, int64_t row, int64_t n) {
        if (n > 0) {
          cpu::linear_forward(n, h, 2 * f, s.experts_read + row * h, w1 + e * 2 * f * h,
                              s.fc1_out.data() + row * 2 * f);
        }
      });
    });
  }
  if (op == "fwd.swiglu") {
    return computation<CpuBackend>([&s, total_rows, f](const auto&) {
      cpu::swiglu_forward(total_rows(), f, s.fc1_out.data(), s.act.data());
    });
  }
  if (op == "fwd.grouped_fc2") {
    return computation<CpuBackend>(
        [&s, per_expert, hand_back, h, f, w2 = w.fc2.data()](const auto&) {
          per_expert([&](int64_t e, int64_t row, int64_t n) {
            if (n > 0) {
              cpu::linear_forward(n, f, h, s.act.data() + row * f, w2 + e * h * f,
                                  s.expert_out.data() + row * h);
            }
          });
          hand_back(s.expert_out.data(), s.expert_out_src.data(), s.tp_send.data());
        });
  }
  if (op == "fwd.combine_a2a") {
    return all_to_all(s.expert_out_src.data(), s.recv_counts, s.combined.data(), s.scratch_counts,
                      copies_capacity);
  }
  if (op == "fwd.unpermute") {
    return computation<CpuBackend>([&s, sh, y = io.y](const auto&) {
      cpu::moe_unpermute(sh, s.routing, s.unpermute_read, y);
    });
  }
  // ---- backward ----
  if (op == "bwd.unpermute") {
    return computation<CpuBackend>([&s, sh, dy = io.dy](const auto&) {
      cpu::moe_unpermute_backward(sh, s.routing, dy, s.unpermute_read, s.d_combined.data(),
                                  s.dgate.data());
    });
  }
  if (op == "bwd.combine_a2a") {
    BoundOp bound = all_to_all(s.d_combined.data(), s.send_counts, s.d_expert_out_src.data(),
                               s.scratch_counts, arrived_capacity);
    bound.after_collective = [&s, h, ep, local](const auto&) {
      moe_detail::regroup(ep, local, rows_of(s.recv_counts, h), h, s.d_expert_out_src.data(),
                          s.d_expert_out.data(), true);
    };
    return bound;
  }
  if (op == "bwd.grouped_fc2_dgrad") {
    return computation<CpuBackend>([&s, per_expert, h, f, w2 = w.fc2.data()](const auto&) {
      per_expert([&](int64_t e, int64_t row, int64_t n) {
        if (n > 0) {
          cpu::linear_dgrad(n, f, h, s.experts_grad + row * h, w2 + e * h * f,
                            s.d_act.data() + row * f);
        }
      });
    });
  }
  if (op == "bwd.grouped_fc2_wgrad") {
    return computation<CpuBackend>([&s, per_expert, h, f, dw2 = w.d_fc2.data()](const auto&) {
      per_expert([&](int64_t e, int64_t row, int64_t n) {
        if (n > 0) {
          cpu::linear_wgrad_accumulate(n, f, h, s.experts_grad + row * h, s.act.data() + row * f,
                                       dw2 + e * h * f);
        }
      });
    });
  }
  if (op == "bwd.swiglu") {
    return computation<CpuBackend>([&s, total_rows, f](const auto&) {
      cpu::swiglu_backward(total_rows(), f, s.fc1_out.data(), s.d_act.data(), s.d_fc1.data());
    });
  }
  if (op == "bwd.grouped_fc1_dgrad") {
    return computation<CpuBackend>(
        [&s, per_expert, hand_back, h, f, w1 = w.fc1.data()](const auto&) {
          per_expert([&](int64_t e, int64_t row, int64_t n) {
            if (n > 0) {
              cpu::linear_dgrad(n, h, 2 * f, s.d_fc1.data() + row * 2 * f, w1 + e * 2 * f * h,
                                s.d_expert_in.data() + row * h);
            }
          });
          hand_back(s.d_expert_in.data(), s.d_expert_in_src.data(), s.d_tp_send.data());
        });
  }
  if (op == "bwd.grouped_fc1_wgrad") {
    return computation<CpuBackend>([&s, per_expert, h, f, dw1 = w.d_fc1.data()](const auto&) {
      per_expert([&](int64_t e, int64_t row, int64_t n) {
        if (n > 0) {
          cpu::linear_wgrad_accumulate(n, h, 2 * f, s.d_fc1.data() + row * 2 * f,
                                       s.experts_read + row * h, dw1 + e * 2 * f * h);
        }
      });
    });
  }
  if (op == "bwd.dispatch_a2a") {
    return all_to_all(s.d_expert_in_src.data(), s.recv_counts, s.d_permuted.data(),
                      s.scratch_counts, copies_capacity);
  }
  if (op == "bwd.permute") {
    return computation<CpuBackend>([&s, sh](const auto&) {
      cpu::moe_permute_backward(sh, s.routing, s.permute_grad, s.d_from_permute.data());
    });
  }
  if (op == "bwd.router") {
    return computation<CpuBackend>([&s, sh, wr = w.router.data(),
                                    scale = loss_scale_](const auto&) {
      // This micro-batch's aux loss has the weight of its mean cross-entropy.
      const float aux_dloss = *scale * static_cast<float>(sh.tokens);
      cpu::moe_router_logits_backward(sh, s.routing, s.dgate.data(), aux_dloss, s.dz.data());
      cpu::linear_dgrad(sh.tokens, sh.hidden, sh.experts, s.dz.data(), wr, s.d_from_router.data());
    });
  }
  if (op == "bwd.router_wgrad") {
    return computation<CpuBackend>([&s, sh, x = io.x, dwr = w.d_router.data()](const auto&) {
      cpu::linear_wgrad_accumulate(sh.tokens, sh.hidden, sh.experts, s.dz.data(), x, dwr);
    });
  }
  return std::nullopt;
}

BoundOp::Task MoeLayersCpu::sum_input_gradient(int64_t layer, int64_t micro_batch,
                                               const MoeLayerIo& io, bool recomputing) {
  State& s = state(micro_batch, layer, recomputing);
  return [&s, dx = io.dx, n = shape_.tokens * shape_.hidden,
          shared = shared_ffn_ > 0](const CpuBackend::Exec&) {
    cpu::add_tensors(n, s.d_from_permute.data(), s.d_from_router.data(), dx);
    if (shared) {
      cpu::add_tensors(n, dx, s.d_from_shared.data(), dx);
      cpu::add_tensors(n, dx, s.d_from_gate.data(), dx);
    }
  };
}

std::vector<ParameterView> MoeLayersCpu::parameters(int64_t layer) {
  Weights& w = *weights_.at(layer);
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  // Under TP every rank routes its own sequence-parallel rows, so the router's gradient is
  // summed over TP, and so are the experts' when every TP rank holds whole experts (etp =
  // 1); with etp = tp each holds a slice whose gradient already covers the TP group's rows.
  const bool router_over_tp = tp_ > 1, experts_over_tp = tp_ > 1 && etp_ == 1;
  auto view = [](std::string name, std::vector<float>& values, std::vector<float>& gradient,
                 bool expert, bool over_tp = false) {
    ParameterView v;
    v.name = std::move(name);
    v.values = values.data();
    v.gradient = gradient.data();
    v.compute = values.data();
    v.count = static_cast<int64_t>(values.size());
    v.expert = expert;
    v.sum_gradient_over_tp = over_tp;
    return v;
  };
  std::vector<ParameterView> views = {
      view(prefix + "router", w.router, w.d_router, false, router_over_tp),
      view(prefix + "experts_fc1", w.fc1, w.d_fc1, true, experts_over_tp),
      view(prefix + "experts_fc2", w.fc2, w.d_fc2, true, experts_over_tp)};
  if (shared_ffn_ > 0) {
    // The gate is replicated and sees the rank's own rows; fc1 and fc2 are TP slices whose
    // gradients cover the gathered rows.
    views.push_back(
        view(prefix + "shared_gate", w.shared_gate, w.d_shared_gate, false, router_over_tp));
    views.push_back(view(prefix + "shared_fc1", w.shared_fc1, w.d_shared_fc1, false));
    views.push_back(view(prefix + "shared_fc2", w.shared_fc2, w.d_shared_fc2, false));
  }
  return views;
}

float MoeLayersCpu::aux_loss_sum(int64_t micro_batches) const {
  float sum = 0.0f;
  for (const auto& [key, s] : states_) {
    if (key.first < micro_batches) sum += s->routing.aux_loss;
  }
  return sum;
}

void MoeLayersCpu::drop_states() {
  states_.clear();
  recompute_states_.clear();
}

int64_t MoeLayersCpu::dropped_copies() const {
  int64_t dropped = 0;
  for (const auto& [key, s] : states_) dropped += s->routing.dropped;
  return dropped;
}

}  // namespace dhelix::rt
