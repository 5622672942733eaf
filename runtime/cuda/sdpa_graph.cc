#include "runtime/cuda/sdpa_graph.h"

#include <algorithm>
#include <limits>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

// Appends tensors and nodes; virtual tensors get ids from 100 up.
class GraphBuilder {
 public:
  GraphBuilder(const kernels::AttentionShape& s, SdpaGraphForm form)
      : b_(s.batch), h_(s.heads), g_(s.kv_heads), s_(s.seq), d_(s.head_dim), form_(form) {}
  SdpaGraphForm form() const { return form_; }

  int64_t bound(int64_t uid, Dims dims, Dims strides, SdpaDtype dtype) {
    graph_.tensors.push_back({uid, dims, strides, dtype, false, false, 0.0f});
    graph_.bound_uids.push_back(uid);
    return uid;
  }
  int64_t scalar(float value) {
    const int64_t uid = next_uid_++;
    graph_.tensors.push_back(
        {uid, {1, 1, 1, 1}, {1, 1, 1, 1}, SdpaDtype::kFloat32, false, true, value});
    return uid;
  }
  int64_t virt(Dims dims, Dims strides, SdpaDtype dtype = SdpaDtype::kFloat32) {
    const int64_t uid = next_uid_++;
    graph_.tensors.push_back({uid, dims, strides, dtype, true, false, 0.0f});
    return uid;
  }
  // Virtual [b, h, s, s] scores and [b, h, s, 1] row statistics.
  int64_t scores(SdpaDtype dtype = SdpaDtype::kFloat32) {
    return virt({b_, h_, s_, s_}, {h_ * s_ * s_, s_ * s_, s_, 1}, dtype);
  }
  int64_t rows() { return virt({b_, h_, s_, 1}, {h_ * s_, s_, 1, 1}); }

  void op(SdpaOpKind kind, SdpaMode mode, const char* name, int64_t x, int64_t b, int64_t y,
          SdpaDtype compute = SdpaDtype::kFloat32, int64_t t = 0, int64_t axis = -1) {
    graph_.ops.push_back({kind, mode, x, b, t, y, axis, compute, name});
  }
  int64_t pointwise(SdpaMode mode, const char* name, int64_t x, int64_t b, int64_t y) {
    op(SdpaOpKind::kPointwise, mode, name, x, b, y);
    return y;
  }

  // Scores masked causally: row (query) >= column (key) keeps the score, else mask_value.
  // The indices are int32 tensors; the form decides the GEN_INDEX math precision.
  int64_t causal_mask(int64_t scores_in, float mask_value) {
    const SdpaDtype index_math =
        form_ == SdpaGraphForm::kLegacy ? SdpaDtype::kInt32 : SdpaDtype::kFloat32;
    const int64_t row = scores(SdpaDtype::kInt32);
    op(SdpaOpKind::kPointwise, SdpaMode::kGenIndex, "gen_row_index", scores_in, 0, row, index_math,
       0, 2);
    const int64_t col = scores(SdpaDtype::kInt32);
    op(SdpaOpKind::kPointwise, SdpaMode::kGenIndex, "gen_col_index", scores_in, 0, col, index_math,
       0, 3);
    const int64_t keep = scores(SdpaDtype::kBoolean);
    op(SdpaOpKind::kPointwise, SdpaMode::kCmpGe, "row_ge_col", row, col, keep, SdpaDtype::kBoolean);
    const int64_t masked = scores();
    op(SdpaOpKind::kPointwise, SdpaMode::kBinarySelect, "causal_select", scores_in,
       scalar(mask_value), masked, SdpaDtype::kFloat32, keep);
    return masked;
  }

  // The layouts of the header comment.
  Dims q_strides() const { return {s_ * h_ * d_, d_, h_ * d_, 1}; }
  Dims kv_strides() const { return {s_ * g_ * d_, d_, g_ * d_, 1}; }
  Dims kv_transposed_strides() const { return {s_ * g_ * d_, d_, 1, g_ * d_}; }
  Dims q_dims() const { return {b_, h_, s_, d_}; }
  Dims kv_dims() const { return {b_, g_, s_, d_}; }
  Dims kv_transposed_dims() const { return {b_, g_, d_, s_}; }
  Dims stats_dims() const { return {b_, h_, s_, 1}; }
  Dims stats_strides() const { return {h_ * s_, s_, 1, 1}; }
  // Per-query-head [b, h, s, d] packed, for GQA's dK and dV before their group sum.
  Dims full_head_strides() const { return {h_ * s_ * d_, s_ * d_, d_, 1}; }
  bool grouped() const { return h_ != g_; }
  int64_t dq_bytes() const { return b_ * h_ * s_ * d_ * 4; }

  SdpaGraph take() {
    std::sort(graph_.bound_uids.begin(), graph_.bound_uids.end());
    return std::move(graph_);
  }
  SdpaGraph& graph() { return graph_; }

 private:
  int64_t b_, h_, g_, s_, d_;
  SdpaGraphForm form_;
  int64_t next_uid_ = 100;
  SdpaGraph graph_;
};

void check_shape(const kernels::AttentionShape& s) {
  DHELIX_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
               s.heads % s.kv_heads == 0);
}

}  // namespace

const SdpaTensor& SdpaGraph::tensor(int64_t uid) const {
  const auto it = std::find_if(tensors.begin(), tensors.end(),
                               [uid](const SdpaTensor& t) { return t.uid == uid; });
  DHELIX_CHECK(it != tensors.end());
  return *it;
}

const char* sdpa_graph_form_name(SdpaGraphForm form) {
  return form == SdpaGraphForm::kLegacy ? "legacy (frontend <= 1.7)" : "current (frontend 1.8+)";
}

float sdpa_mask_value(int64_t cudnn_version) {
  return cudnn_version >= 91000 ? -std::numeric_limits<float>::infinity()
                                : std::numeric_limits<float>::lowest();
}

SdpaGraph sdpa_forward_graph(const kernels::AttentionShape& shape, int64_t cudnn_version,
                             SdpaGraphForm form) {
  check_shape(shape);
  GraphBuilder g(shape, form);
  const auto bf16 = SdpaDtype::kBFloat16;
  const int64_t q = g.bound(kSdpaQ, g.q_dims(), g.q_strides(), bf16);
  const int64_t kt = g.bound(kSdpaK, g.kv_transposed_dims(), g.kv_transposed_strides(), bf16);
  const int64_t v = g.bound(kSdpaV, g.kv_dims(), g.kv_strides(), bf16);
  const int64_t o = g.bound(kSdpaO, g.q_dims(), g.q_strides(), bf16);
  const int64_t stats = g.bound(kSdpaStats, g.stats_dims(), g.stats_strides(), SdpaDtype::kFloat32);

  const int64_t s = g.scores();
  g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "bmm1_q_kt", q, kt, s);
  const int64_t scaled =
      g.pointwise(SdpaMode::kMul, "attn_scale", s,
                  g.scalar(kernels::attention_scale(shape.head_dim)), g.scores());
  const int64_t masked = g.causal_mask(scaled, sdpa_mask_value(cudnn_version));
  // Softmax with its statistics: stats = max + log(sum exp(s - max)).
  const int64_t max = g.rows();
  g.op(SdpaOpKind::kReduction, SdpaMode::kReduceMax, "row_max", masked, 0, max);
  const int64_t centred = g.pointwise(SdpaMode::kSub, "sub_max", masked, max, g.scores());
  const int64_t exp = g.pointwise(SdpaMode::kExp, "exp", centred, 0, g.scores());
  const int64_t sum = g.rows();
  g.op(SdpaOpKind::kReduction, SdpaMode::kReduceAdd, "row_sum", exp, 0, sum);
  const int64_t log = g.pointwise(SdpaMode::kLog, "log_sum", sum, 0, g.rows());
  g.pointwise(SdpaMode::kAdd, "stats", max, log, stats);
  // The probabilities enter the second matmul in the I/O type (the frontend: "requirement
  // by cudnn backend to take in bmm2 aType as i/o type").
  const int64_t p = g.pointwise(SdpaMode::kDiv, "softmax", exp, sum, g.scores(bf16));
  g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "bmm2_p_v", p, v, o);
  return g.take();
}

SdpaGraph sdpa_backward_graph(const kernels::AttentionShape& shape, int64_t cudnn_version,
                              bool deterministic, SdpaGraphForm form) {
  check_shape(shape);
  GraphBuilder g(shape, form);
  const auto bf16 = SdpaDtype::kBFloat16;
  const auto f32 = SdpaDtype::kFloat32;
  const int64_t b = shape.batch, h = shape.heads, sq = shape.seq, d = shape.head_dim;
  const int64_t q = g.bound(kSdpaQ, g.q_dims(), g.q_strides(), bf16);
  const int64_t kt = g.bound(kSdpaK, g.kv_transposed_dims(), g.kv_transposed_strides(), bf16);
  const int64_t vt = g.bound(kSdpaV, g.kv_transposed_dims(), g.kv_transposed_strides(), bf16);
  const int64_t o = g.bound(kSdpaO, g.q_dims(), g.q_strides(), bf16);
  const int64_t stats = g.bound(kSdpaStats, g.stats_dims(), g.stats_strides(), f32);
  const int64_t dout = g.bound(kSdpaDO, g.q_dims(), g.q_strides(), bf16);
  const int64_t dq = g.bound(kSdpaDQ, g.q_dims(), g.q_strides(), bf16);
  const int64_t dk = g.bound(kSdpaDK, g.kv_dims(), g.kv_strides(), bf16);
  const int64_t dv = g.bound(kSdpaDV, g.kv_dims(), g.kv_strides(), bf16);
  const int64_t softmax_sum =
      g.bound(kSdpaSoftmaxSum, g.stats_dims(), g.stats_strides(), SdpaDtype::kFloat32);

  // softmax_sum = rowsum(dO * O) (dhelix's delta).
  const int64_t prod = g.pointwise(SdpaMode::kMul, "mul_do_o", dout, o,
                                   g.virt(g.q_dims(), {h * sq * d, sq * d, h * d, 1}));
  const int64_t row_sum = g.rows();
  g.op(SdpaOpKind::kReduction, SdpaMode::kReduceAdd, "reduce_do_o", prod, 0, row_sum);
  g.pointwise(SdpaMode::kMul, "softmax_sum", row_sum, g.scalar(1.0f), softmax_sum);

  // P = exp(scale * Q K^T - stats), masked causally: after the subtraction (kCurrent) or
  // before it (kLegacy); a masked score is -inf (or the lowest float) either way.
  const int64_t s = g.scores();
  g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "matmul_q_kt", q, kt, s);
  const float scale = kernels::attention_scale(shape.head_dim);
  const int64_t scaled = g.pointwise(SdpaMode::kMul, "mul_s_scale", s, g.scalar(scale), g.scores());
  const float mask_value = sdpa_mask_value(cudnn_version);
  int64_t logits = 0;
  if (form == SdpaGraphForm::kLegacy) {
    const int64_t masked = g.causal_mask(scaled, mask_value);
    logits = g.pointwise(SdpaMode::kSub, "sub_s_stats", masked, stats, g.scores());
  } else {
    const int64_t centred = g.pointwise(SdpaMode::kSub, "sub_s_stats", scaled, stats, g.scores());
    logits = g.causal_mask(centred, mask_value);
  }
  const int64_t p = g.pointwise(SdpaMode::kExp, "exp_s", logits, 0, g.scores());

  // dV = P^T dO (per query head, then summed over each group under GQA).
  const Dims transposed{h * sq * sq, sq * sq, 1, sq};
  const int64_t pt = g.virt({b, h, sq, sq}, transposed, bf16);
  g.op(SdpaOpKind::kReshape, SdpaMode::kNone, "reshape_p", p, 0, pt);
  auto grouped_output = [&](const char* matmul_name, int64_t a, int64_t m, int64_t out) {
    if (!g.grouped()) {
      g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, matmul_name, a, m, out);
      return;
    }
    const int64_t full = g.virt(g.q_dims(), g.full_head_strides(), bf16);
    g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, matmul_name, a, m, full);
    g.op(SdpaOpKind::kReduction, SdpaMode::kReduceAdd, "sum_over_group", full, 0, out);
  };
  grouped_output("matmul_pt_do", pt, dout, dv);

  // dS = scale * P * (dO V^T - softmax_sum).
  const int64_t dp = g.scores();
  g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "matmul_do_vt", dout, vt, dp);
  const int64_t dp_centred = g.pointwise(SdpaMode::kSub, "sub_dp_sum", dp, softmax_sum, g.scores());
  const int64_t dp_p = g.pointwise(SdpaMode::kMul, "mul_dp_p", dp_centred, p, g.scores());
  const int64_t ds = g.pointwise(SdpaMode::kMul, "mul_ds_scale", dp_p, g.scalar(scale), g.scores());

  // dK = dS^T Q (grouped as dV).
  const int64_t dst = g.virt({b, h, sq, sq}, transposed, bf16);
  g.op(SdpaOpKind::kReshape, SdpaMode::kNone, "reshape_ds", ds, 0, dst);
  grouped_output("matmul_dst_q", dst, q, dk);

  // dQ = dS K, K being K^T's memory read untransposed.
  const int64_t k = g.virt(g.kv_dims(), g.kv_strides(), bf16);
  g.op(SdpaOpKind::kReshape, SdpaMode::kNone, "reshape_k", kt, 0, k);
  if (deterministic) {
    g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "matmul_ds_k", ds, k, dq);
  } else {
    const int64_t accum =
        g.bound(kSdpaDQAccum, g.q_dims(), g.full_head_strides(), SdpaDtype::kFloat32);
    g.graph().tensors.back().reorder_f16x16 = form == SdpaGraphForm::kLegacy;
    g.op(SdpaOpKind::kMatmul, SdpaMode::kNone, "matmul_ds_k", ds, k, accum);
    g.pointwise(SdpaMode::kIdentity, "dq_from_accum", accum, 0, dq);
    g.graph().dq_accum_bytes = g.dq_bytes();
  }
  return g.take();
}

}  // namespace dhelix::cuda
