#include "runtime/cuda/moe_layers_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "lib/error.h"
#include "lib/placement.h"
#include "lib/rank_shape.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::cuda {

namespace {

using rt::model_detail::HostTensor;
using rt::model_detail::Parameter;

// The routed experts' ops (lib/dag_builder_moe.cc) without expert TP's exchanges.
constexpr std::array<const char*, 19> kOps = {"fwd.router",
                                              "fwd.permute",
                                              "fwd.dispatch_a2a",
                                              "fwd.grouped_fc1",
                                              "fwd.swiglu",
                                              "fwd.grouped_fc2",
                                              "fwd.combine_a2a",
                                              "fwd.unpermute",
                                              "bwd.unpermute",
                                              "bwd.combine_a2a",
                                              "bwd.grouped_fc2_dgrad",
                                              "bwd.grouped_fc2_wgrad",
                                              "bwd.swiglu",
                                              "bwd.grouped_fc1_dgrad",
                                              "bwd.grouped_fc1_wgrad",
                                              "bwd.dispatch_a2a",
                                              "bwd.permute",
                                              "bwd.router",
                                              "bwd.router_wgrad"};

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

struct MoeLayersCuda::Weights {
  Parameter<CudaBackend> router, fc1, fc2;  // [E, h], [L, 2F, h], [L, h, F]
};

// One (micro-batch, layer)'s device buffers; R = E C padded rows everywhere (see the header).
struct MoeLayersCuda::State {
  int32_t* chosen = nullptr;
  float *gate = nullptr, *probs = nullptr, *aux = nullptr, *dgate = nullptr;
  uint8_t* kept = nullptr;
  int64_t *row = nullptr, *routed = nullptr, *send_counts = nullptr, *recv_counts = nullptr,
          *scratch_counts = nullptr;
  bf16 *logits = nullptr, *dz = nullptr;                                       // [T, E]
  bf16 *permuted = nullptr, *received = nullptr, *expert_in = nullptr;         // [R, h]
  bf16 *fc1_out = nullptr, *act = nullptr;                                     // [R, 2F], [R, F]
  bf16 *expert_out = nullptr, *expert_out_src = nullptr, *combined = nullptr;  // [R, h]
  bf16 *d_combined = nullptr, *d_expert_out_src = nullptr, *d_expert_out = nullptr;
  bf16 *d_act = nullptr, *d_fc1 = nullptr;
  bf16 *d_expert_in = nullptr, *d_expert_in_src = nullptr, *d_permuted = nullptr;
  bf16 *d_from_permute = nullptr, *d_from_router = nullptr;  // [T, h]
  // Where each stage reads: without EP there is no exchange, and the experts read and
  // write the rank's own layout (expert-major and source-major coincide with ep = 1).
  bf16 *experts_read = nullptr, *unpermute_read = nullptr, *experts_grad = nullptr,
       *permute_grad = nullptr;
  MoeDeviceRouting routing() const {
    return {.chosen = chosen,
            .gate = gate,
            .probs = probs,
            .kept = kept,
            .row = row,
            .routed = routed,
            .send_counts = send_counts,
            .aux_loss = aux};
  }
};

MoeLayersCuda::MoeLayersCuda(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers,
                             uint64_t seed, const float* loss_scale, CudaBackend::Memory& memory)
    : loss_scale_(loss_scale), memory_(memory) {
  const MoeSpec& moe = *job.model.moe;
  const RankShape dims = rank_shape(job, rank);
  if (dims.tp != 1 || moe.shared_expert_ffn_hidden_size > 0 ||
      job.parallel.recompute.granularity != RecomputeGranularity::kNone) {
    throw Error(ErrorCode::kUnsupported,
                "MoE on the cuda backend: only tp = 1 without a shared expert or recompute "
                "(runtime/train/moe_support.cc names the part)");
  }
  ep_ = job.parallel.ep;
  DHELIX_CHECK(moe.num_experts % ep_ == 0);
  local_ = moe.num_experts / ep_;
  ep_rank_ = Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).ep;
  ffn_ = moe.expert_ffn_hidden_size;
  shape_ = MoeDeviceShape{
      .tokens = dims.rows,
      .hidden = dims.hidden,
      .experts = moe.num_experts,
      .top_k = moe.top_k,
      .capacity =
          moe.capacity_factor > 0.0
              ? kernels::expert_capacity(dims.rows, moe.top_k, moe.num_experts, moe.capacity_factor)
              : 0,
      .aux_loss_coeff = moe.aux_loss_weight()};
  check_moe_shape(shape_);
  // The CPU's initial values (moe_layers_cpu.cc with etp = 1): element (r, c) of local
  // expert e is element (first + e, r, c) of the full tensor of all E experts.
  const int64_t h = shape_.hidden, f = ffn_, e_all = shape_.experts, first = ep_rank_ * local_;
  const float router_bound = 1.0f / std::sqrt(static_cast<float>(h));
  for (int64_t layer : layers) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    auto tensor = [&](const std::string& name, int64_t experts, int64_t rows, int64_t cols,
                      int64_t expert0, float bound) {
      HostTensor host{prefix + name, std::vector<float>(to_size(experts * rows * cols)), false};
      for (int64_t i = 0; i < experts * rows * cols; ++i) {
        host.values[to_size(i)] =
            rt::model_detail::init_uniform(seed, prefix + name, expert0 * rows * cols + i, bound);
      }
      return rt::model_detail::place_parameter<CudaBackend>(memory_, host);
    };
    auto w = std::make_unique<Weights>();
    w->router = tensor("router", 1, e_all, h, 0, router_bound);
    w->fc1 = tensor("experts_fc1", local_, 2 * f, h, first, router_bound);
    w->fc2 = tensor("experts_fc2", local_, h, f, first, 1.0f / std::sqrt(static_cast<float>(f)));
    weights_.emplace(layer, std::move(w));
  }
}

MoeLayersCuda::~MoeLayersCuda() = default;

bool MoeLayersCuda::handles(const std::string& op) {
  return std::find(kOps.begin(), kOps.end(), op) != kOps.end();
}

MoeLayersCuda::State& MoeLayersCuda::state(int64_t micro_batch, int64_t layer) {
  std::unique_ptr<State>& slot = states_[{micro_batch, layer}];
  if (slot) return *slot;
  slot = std::make_unique<State>();
  State& s = *slot;
  CudaBackend::Memory& m = memory_;
  const int64_t t = shape_.tokens, h = shape_.hidden, e = shape_.experts, k = shape_.top_k;
  const int64_t rows = kernels::padded_rows(e, shape_.capacity), f = ffn_;
  s.chosen = m.allocate<int32_t>(t * k);
  s.gate = m.allocate<float>(t * k);
  s.dgate = m.allocate<float>(t * k);
  s.probs = m.allocate<float>(t * e);
  s.aux = m.allocate<float>(1);
  s.kept = m.allocate<uint8_t>(t * k);
  s.row = m.allocate<int64_t>(t * k);
  s.routed = m.allocate<int64_t>(e);
  s.send_counts = m.allocate<int64_t>(e);
  s.recv_counts = m.allocate<int64_t>(e);
  s.scratch_counts = m.allocate<int64_t>(e);
  s.logits = m.allocate<bf16>(t * e);
  s.dz = m.allocate<bf16>(t * e);
  for (bf16** buffer : {&s.permuted, &s.expert_out, &s.d_combined, &s.d_expert_in}) {
    *buffer = m.allocate<bf16>(rows * h);
  }
  s.fc1_out = m.allocate<bf16>(rows * 2 * f);
  s.d_fc1 = m.allocate<bf16>(rows * 2 * f);
  s.act = m.allocate<bf16>(rows * f);
  s.d_act = m.allocate<bf16>(rows * f);
  s.d_from_permute = m.allocate<bf16>(t * h);
  s.d_from_router = m.allocate<bf16>(t * h);
  if (ep_ > 1) {
    for (bf16** buffer :
         {&s.received, &s.expert_in, &s.expert_out_src, &s.combined, &s.d_expert_out_src,
          &s.d_expert_out, &s.d_expert_in_src, &s.d_permuted}) {
      *buffer = m.allocate<bf16>(rows * h);
    }
  }
  const bool ep = ep_ > 1;
  s.experts_read = ep ? s.expert_in : s.permuted;
  s.unpermute_read = ep ? s.combined : s.expert_out;
  s.experts_grad = ep ? s.d_expert_out : s.d_combined;
  s.permute_grad = ep ? s.d_permuted : s.d_expert_in;
  return s;
}

std::optional<MoeLayersCuda::BoundOp> MoeLayersCuda::bind(const std::string& op, int64_t layer,
                                                          int64_t micro_batch,
                                                          const MoeDeviceLayerIo& io,
                                                          bool recomputing) {
  using Exec = CudaBackend::Exec;
  using rt::model_detail::computation;
  if (!handles(op)) return std::nullopt;
  if (recomputing) throw Error(ErrorCode::kInternal, "MoeLayersCuda: no recompute (refused)");
  if (op.ends_with("_a2a") && ep_ == 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {} does not occur with ep = 1", op));
  }
  State& s = state(micro_batch, layer);
  Weights& w = *weights_.at(layer);
  const MoeDeviceShape sh = shape_;
  const int64_t h = sh.hidden, f = ffn_, ep = ep_, local = local_, c = sh.capacity;
  const int64_t per_expert = ep * c;  // rows each local expert computes on
  const int64_t rows = kernels::padded_rows(sh.experts, c);
  // The padded all-to-all over the EP group: out's capacity E C h in blocks of L C h, L
  // counts per member.
  auto all_to_all = [&](const bf16* in, const int64_t* send, bf16* out, int64_t* recv) {
    BoundOp bound;
    rt::CollectiveRequest request =
        rt::model_detail::collective(rt::CollectiveKind::kAllToAllV, in, out, rows * h);
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
  auto regroup = [ep, local, c, h](const bf16* from, bf16* to, bool to_expert, const Exec& x) {
    moe_regroup(ep, local, c, h, from, to, to_expert, x.stream);
  };

  // ---- forward ----
  if (op == "fwd.router") {
    return computation<CudaBackend>([&s, sh, x = io.x, wr = w.router.compute](const Exec& e) {
      CudaBackend::linear_forward(e, sh.tokens, sh.hidden, sh.experts, x, wr, s.logits);
      moe_route(sh, s.logits, s.routing(), e.stream);
    });
  }
  if (op == "fwd.permute") {
    return computation<CudaBackend>([&s, sh, x = io.x](const Exec& e) {
      moe_permute(sh, s.routing(), x, s.permuted, e.stream);
    });
  }
  if (op == "fwd.dispatch_a2a") {
    BoundOp bound = all_to_all(s.permuted, s.send_counts, s.received, s.recv_counts);
    bound.after_collective = [&s, regroup](const Exec& e) {
      regroup(s.received, s.expert_in, true, e);
    };
    return bound;
  }
  if (op == "fwd.grouped_fc1") {
    return computation<CudaBackend>(
        [&s, per_expert_gemm, per_expert, h, f, w1 = w.fc1.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_forward(e, per_expert, h, 2 * f, s.experts_read + row * h,
                                        w1 + x * 2 * f * h, s.fc1_out + row * 2 * f);
          });
        });
  }
  if (op == "fwd.swiglu") {
    return computation<CudaBackend>([&s, rows, f](const Exec& e) {
      CudaBackend::swiglu_forward(e, rows, f, s.fc1_out, s.act);
    });
  }
  if (op == "fwd.grouped_fc2") {
    return computation<CudaBackend>(
        [&s, per_expert_gemm, regroup, per_expert, h, f, ep, w2 = w.fc2.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_forward(e, per_expert, f, h, s.act + row * f, w2 + x * h * f,
                                        s.expert_out + row * h);
          });
          if (ep > 1) regroup(s.expert_out, s.expert_out_src, false, e);
        });
  }
  if (op == "fwd.combine_a2a") {
    return all_to_all(s.expert_out_src, s.recv_counts, s.combined, s.scratch_counts);
  }
  if (op == "fwd.unpermute") {
    return computation<CudaBackend>([&s, sh, y = io.y](const Exec& e) {
      moe_unpermute(sh, s.routing(), s.unpermute_read, y, e.stream);
    });
  }
  // ---- backward ----
  if (op == "bwd.unpermute") {
    return computation<CudaBackend>([&s, sh, dy = io.dy](const Exec& e) {
      moe_unpermute_backward(sh, s.routing(), dy, s.unpermute_read, s.d_combined, s.dgate,
                             e.stream);
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
    return computation<CudaBackend>(
        [&s, per_expert_gemm, per_expert, h, f, w2 = w.fc2.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_dgrad(e, per_expert, f, h, s.experts_grad + row * h, w2 + x * h * f,
                                      s.d_act + row * f);
          });
        });
  }
  if (op == "bwd.grouped_fc2_wgrad") {
    return computation<CudaBackend>(
        [&s, per_expert_gemm, per_expert, h, f, dw2 = w.fc2.gradient](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_wgrad_accumulate(e, per_expert, f, h, s.experts_grad + row * h,
                                                 s.act + row * f, dw2 + x * h * f);
          });
        });
  }
  if (op == "bwd.swiglu") {
    return computation<CudaBackend>([&s, rows, f](const Exec& e) {
      CudaBackend::swiglu_backward(e, rows, f, s.fc1_out, s.d_act, s.d_fc1);
    });
  }
  if (op == "bwd.grouped_fc1_dgrad") {
    return computation<CudaBackend>(
        [&s, per_expert_gemm, regroup, per_expert, h, f, ep, w1 = w.fc1.compute](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_dgrad(e, per_expert, h, 2 * f, s.d_fc1 + row * 2 * f,
                                      w1 + x * 2 * f * h, s.d_expert_in + row * h);
          });
          if (ep > 1) regroup(s.d_expert_in, s.d_expert_in_src, false, e);
        });
  }
  if (op == "bwd.grouped_fc1_wgrad") {
    return computation<CudaBackend>(
        [&s, per_expert_gemm, per_expert, h, f, dw1 = w.fc1.gradient](const Exec& e) {
          per_expert_gemm([&](int64_t x, int64_t row) {
            CudaBackend::linear_wgrad_accumulate(e, per_expert, h, 2 * f, s.d_fc1 + row * 2 * f,
                                                 s.experts_read + row * h, dw1 + x * 2 * f * h);
          });
        });
  }
  if (op == "bwd.dispatch_a2a") {
    return all_to_all(s.d_expert_in_src, s.recv_counts, s.d_permuted, s.scratch_counts);
  }
  if (op == "bwd.permute") {
    return computation<CudaBackend>([&s, sh](const Exec& e) {
      moe_permute_backward(sh, s.routing(), s.permute_grad, s.d_from_permute, e.stream);
    });
  }
  if (op == "bwd.router") {
    return computation<CudaBackend>(
        [&s, sh, wr = w.router.compute, scale = loss_scale_](const Exec& e) {
          // This micro-batch's aux loss has the weight of its mean cross-entropy.
          const float aux_dloss = *scale * static_cast<float>(sh.tokens);
          moe_router_logits_backward(sh, s.routing(), s.dgate, aux_dloss, s.dz, e.stream);
          CudaBackend::linear_dgrad(e, sh.tokens, sh.hidden, sh.experts, s.dz, wr, s.d_from_router);
        });
  }
  if (op == "bwd.router_wgrad") {
    return computation<CudaBackend>([&s, sh, x = io.x, dwr = w.router.gradient](const Exec& e) {
      CudaBackend::linear_wgrad_accumulate(e, sh.tokens, sh.hidden, sh.experts, s.dz, x, dwr);
    });
  }
  return std::nullopt;
}

MoeLayersCuda::BoundOp::Task MoeLayersCuda::sum_input_gradient(int64_t layer, int64_t micro_batch,
                                                               const MoeDeviceLayerIo& io,
                                                               bool recomputing) {
  if (recomputing) throw Error(ErrorCode::kInternal, "MoeLayersCuda: no recompute (refused)");
  State& s = state(micro_batch, layer);
  return [&s, dx = io.dx, n = shape_.tokens * shape_.hidden](const CudaBackend::Exec& e) {
    CudaBackend::add_tensors(e, n, s.d_from_permute, s.d_from_router, dx);
  };
}

std::vector<MoeLayersCuda::ParameterView> MoeLayersCuda::parameters(int64_t layer) {
  Weights& w = *weights_.at(layer);
  auto view = [](Parameter<CudaBackend>& p, bool expert) {
    return ParameterView{p.name, p.values, p.gradient, p.compute, p.count, false, expert};
  };
  return {view(w.router, false), view(w.fc1, true), view(w.fc2, true)};
}

float MoeLayersCuda::aux_loss_sum(int64_t micro_batches) {
  float sum = 0.0f;
  for (const auto& [key, s] : states_) {
    if (key.first >= micro_batches) continue;
    float aux = 0.0f;
    memory_.download(s->aux, &aux, 1);
    sum += aux;
  }
  return sum;
}

int64_t MoeLayersCuda::dropped_copies() {
  const int64_t assignments = shape_.tokens * shape_.top_k;
  std::vector<uint8_t> kept(to_size(assignments));
  int64_t dropped = 0;
  for (const auto& [key, s] : states_) {
    memory_.download(s->kept, kept.data(), assignments);
    for (uint8_t flag : kept) dropped += flag == 0 ? 1 : 0;
  }
  return dropped;
}

}  // namespace dhelix::cuda
