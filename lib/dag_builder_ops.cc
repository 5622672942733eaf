// Op factories and the per-rank context of the DAG builder (see dag_builder_internal.h for
// what each op records).

#include <algorithm>
#include <utility>

#include "lib/dag_builder_internal.h"
#include "lib/error.h"
#include "lib/fsdp_sizes.h"

namespace dhelix::dag_detail {

int64_t BuildContext::fc1_width(int64_t ffn_columns) const {
  return model->activation == ActivationKind::kSwiGlu ? 2 * ffn_columns : ffn_columns;
}

const ProcessGroup& BuildContext::group(ParallelDim dim) const {
  switch (dim) {
    case ParallelDim::kCp:
      return cp_group;
    case ParallelDim::kEp:
      return ep_group;
    case ParallelDim::kDp:
      return dp_group;
    default:
      break;
  }
  DHELIX_CHECK_MSG(dim == ParallelDim::kTp, "layer DAGs communicate over tp, cp, ep and dp only");
  return tp_group;
}

BuildContext make_context(const JobSpec& job, int64_t rank) {
  BuildContext ctx;
  static_cast<RankShape&>(ctx) = rank_shape(job, rank);
  ctx.model = &job.model;
  ctx.parallel = &job.parallel;
  ctx.dtype = job.model.dtype;
  ctx.dt = dtype_bytes(job.model.dtype);
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  ctx.tp_group = placement.group(ParallelDim::kTp, rank);
  ctx.cp_group = placement.group(ParallelDim::kCp, rank);
  ctx.ep_group = placement.group(ParallelDim::kEp, rank);
  ctx.dp_group = placement.group(ParallelDim::kDp, rank);  // FSDP (dag_builder_fsdp.cc)
  if (fsdp_shards_experts(job.model, job.parallel)) {
    ctx.edp_group = fsdp_expert_group(placement, job.parallel, rank);
  }
  // The CP communication type's groups (ParallelSpec::cp_a2a_group / cp_ring_group sizes).
  const ParallelSpec& p = job.parallel;
  const ProcessGroup own_only = placement.cp_sub_group(rank, p.cp, Placement::CpLevel::kRing);
  ctx.cp_a2a_group = own_only;
  ctx.cp_ring_group = own_only;
  if (p.cp_comm_type == CpCommType::kP2p) ctx.cp_ring_group = ctx.cp_group;
  if (p.cp_comm_type == CpCommType::kA2a) ctx.cp_a2a_group = ctx.cp_group;
  if (p.cp_comm_type == CpCommType::kA2aP2p && p.cp > 1) {
    const int64_t a2a = p.cp_a2a_group();
    ctx.cp_a2a_group = placement.cp_sub_group(rank, a2a, Placement::CpLevel::kA2a);
    ctx.cp_ring_group = placement.cp_sub_group(rank, a2a, Placement::CpLevel::kRing);
  }
  return ctx;
}

int64_t add_after(LayerDag& dag, Op op, const std::vector<int64_t>& after) {
  const int64_t index = dag.add_op(std::move(op));
  for (const int64_t from : after) dag.add_edge(from, index);
  return index;
}

namespace {

Op base_op(const BuildContext& ctx, std::string id, OpKind kind, Pass pass) {
  Op op;
  op.id = std::move(id);
  op.kind = kind;
  op.pass = pass;
  op.dtype = ctx.dtype;
  return op;
}

double as_double(int64_t v) { return static_cast<double>(v); }

}  // namespace

Op make_gemm(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, GemmRole role,
             int64_t batch, int64_t m, int64_t n, int64_t k) {
  Op op = base_op(ctx, std::move(id), kind, pass);
  op.gemm_role = role;
  op.shape.batch = batch;
  op.shape.m = m;
  op.shape.n = n;
  op.shape.k = k;
  op.flops = 2.0 * as_double(batch) * as_double(m) * as_double(n) * as_double(k);
  op.bytes_read = ctx.bytes(batch * (m * k + k * n));
  op.bytes_written = ctx.bytes(batch * m * n);
  return op;
}

Op make_wgrad(const BuildContext& ctx, std::string id, OpKind kind, int64_t batch, int64_t m,
              int64_t n, int64_t k) {
  // dW (n×k, stored as the weight's out×in) = dYᵀ (n×m) · X (m×k): the tokens are the
  // reduction dimension.
  Op op = make_gemm(ctx, std::move(id), kind, Pass::kBackward, GemmRole::kWgrad, batch, n, k, m);
  op.movable_sink = true;
  return op;
}

AttentionShape local_attention(const BuildContext& ctx, int64_t kv_len) {
  return {.heads = ctx.heads, .kv_heads = ctx.kv_heads, .q_len = ctx.seq_shard, .kv_len = kv_len};
}

Op make_attention(const BuildContext& ctx, std::string id, Pass pass, int64_t kv_len) {
  return make_attention(ctx, std::move(id), pass, local_attention(ctx, kv_len));
}

Op make_attention(const BuildContext& ctx, std::string id, Pass pass, const AttentionShape& shape) {
  Op op = base_op(ctx, std::move(id), OpKind::kAttention, pass);
  OpShape& s = op.shape;
  s.batch = ctx.micro_batch;
  s.heads = shape.heads;
  s.kv_heads = shape.kv_heads;
  s.q_len = shape.q_len;
  s.kv_len = shape.kv_len;
  s.head_dim = ctx.head_dim;
  s.causal = true;  // decoder-only models
  // A sliding window shorter than the sequence bounds the keys each query attends to
  // (exact for cp = 1; a CP ring step is charged as if it held the window's diagonal).
  const int64_t window = ctx.model->sliding_window;
  if (window > 0 && window < ctx.parallel->seq_length) s.window = window;
  const int64_t keys = s.window > 0 ? std::min(s.kv_len, s.window) : s.kv_len;
  // Model FLOPs: no causal discount, as in training_flops_per_iteration.
  const double forward_flops = 4.0 * as_double(s.batch) * as_double(s.heads) * as_double(s.q_len) *
                               as_double(keys) * as_double(s.head_dim);
  const int64_t q = s.batch * s.q_len * s.heads * s.head_dim;       // Q, O, dQ, dO elements
  const int64_t kv = s.batch * s.kv_len * s.kv_heads * s.head_dim;  // K or V elements
  const int64_t lse_bytes = s.batch * s.heads * s.q_len * 4;        // fp32 log-sum-exp
  if (pass == Pass::kForward) {
    op.flops = forward_flops;
    op.bytes_read = ctx.bytes(q + 2 * kv);
    op.bytes_written = ctx.bytes(q) + lse_bytes;
  } else {
    op.flops = 2.0 * forward_flops;
    op.bytes_read = ctx.bytes(3 * q + 2 * kv) + lse_bytes;
    op.bytes_written = ctx.bytes(q + 2 * kv);
  }
  return op;
}

Op make_memory_op(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, int64_t m,
                  int64_t n, double flops_per_element, double read_tensors,
                  double written_tensors) {
  Op op = base_op(ctx, std::move(id), kind, pass);
  op.shape.m = m;
  op.shape.n = n;
  const double elements = as_double(m) * as_double(n);
  op.flops = flops_per_element * elements;
  op.bytes_read = static_cast<int64_t>(read_tensors * elements) * ctx.dt;
  op.bytes_written = static_cast<int64_t>(written_tensors * elements) * ctx.dt;
  return op;
}

Op make_norm(const BuildContext& ctx, std::string id, Pass pass, int64_t rows) {
  const bool rms = ctx.model->norm == NormKind::kRmsNorm;
  const double per_element = rms ? kFlopsPerRmsNormElement : kFlopsPerLayerNormElement;
  const bool forward = pass == Pass::kForward;
  // Forward reads x, writes y; backward reads x and dy, writes dx. The weight (h values)
  // and the per-row statistics are small and left out.
  Op op = make_memory_op(ctx, std::move(id), OpKind::kNorm, pass, rows, ctx.hidden,
                         forward ? per_element : 2 * per_element, forward ? 1 : 2, 1);
  op.variant = norm_kind_name(ctx.model->norm);
  return op;
}

Op make_bda(const BuildContext& ctx, std::string id, Pass pass) {
  // Forward reads the branch output and the residual, writes the sum. Backward applies the
  // dropout mask to the incoming gradient and adds the residual stream's gradient: reads
  // two tensors, writes one.
  const double per_element = pass == Pass::kForward ? kFlopsPerBdaElement : 2;
  Op op = make_memory_op(ctx, std::move(id), OpKind::kBiasDropoutAdd, pass, ctx.rows, ctx.hidden,
                         per_element, 2, 1);
  if (ctx.model->linear_bias) op.variant = "bias";
  return op;
}

Op make_activation(const BuildContext& ctx, std::string id, Pass pass, int64_t rows,
                   int64_t width) {
  const bool gated = ctx.model->activation == ActivationKind::kSwiGlu;
  const double per_element = gated ? kFlopsPerSwiGluElement : kFlopsPerGeluElement;
  const double inputs = gated ? 2 : 1;  // gate and up halves
  const bool forward = pass == Pass::kForward;
  // Forward reads the input(s), writes the output; backward reads the input(s) and dy,
  // writes d(input).
  Op op = make_memory_op(ctx, std::move(id), OpKind::kActivation, pass, rows, width,
                         forward ? per_element : 2 * per_element, forward ? inputs : inputs + 1,
                         forward ? 1 : inputs);
  op.variant = activation_kind_name(ctx.model->activation);
  return op;
}

Op make_comm(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, ParallelDim dim,
             int64_t bytes, DType dtype) {
  return make_comm_on(ctx, std::move(id), kind, pass, dim, ctx.group(dim), bytes, dtype);
}

Op make_comm_on(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, ParallelDim dim,
                const ProcessGroup& group, int64_t bytes, DType dtype) {
  DHELIX_CHECK(is_communication(kind));
  Op op = base_op(ctx, std::move(id), kind, pass);
  op.dtype = dtype;
  DHELIX_CHECK_MSG(group.ranks.size() > 1, "communication over a group of one: " + op.id);
  op.comm_bytes = bytes;
  op.group = dim;
  op.group_size = static_cast<int64_t>(group.ranks.size());
  op.scope = group.scope;
  op.nodes_spanned = group.nodes_spanned;
  op.stream = group.scope == GroupScope::kLocal ? StreamClass::kLocalComm : StreamClass::kCrossComm;
  return op;
}

std::string activation_id(const BuildContext& ctx) {
  return activation_kind_name(ctx.model->activation);
}

}  // namespace dhelix::dag_detail
