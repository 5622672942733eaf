#include "runtime/cuda/device_setup.h"

#include <algorithm>
#include <set>

#include "runtime/kernels/moe_capacity.h"

namespace dhelix::cuda {
namespace {

// CUDA's default per-thread stack (CUDA Programming Guide, cudaLimitStackSize): asking for
// less changes nothing.
constexpr int64_t kDefaultStackBytes = 1024;

}  // namespace

GemmShape linear_forward_shape(int64_t rows, int64_t in, int64_t out) {
  return {.transpose_a = false,
          .transpose_b = true,
          .m = rows,
          .n = out,
          .k = in,
          .fp32_output = false};
}

GemmShape linear_dgrad_shape(int64_t rows, int64_t in, int64_t out) {
  return {.transpose_a = false,
          .transpose_b = false,
          .m = rows,
          .n = in,
          .k = out,
          .fp32_output = false};
}

GemmShape linear_wgrad_shape(int64_t rows, int64_t in, int64_t out) {
  return {.transpose_a = true,
          .transpose_b = false,
          .m = out,
          .n = in,
          .k = rows,
          .fp32_output = true,
          .accumulate = true};
}

GemmShape gemm_shape_of_role(GemmRole role, int64_t m, int64_t n, int64_t k) {
  switch (role) {
    case GemmRole::kDgrad:  // dx[rows, in] = dy[rows, out] W[out, in]
      return linear_dgrad_shape(/*rows=*/m, /*in=*/n, /*out=*/k);
    case GemmRole::kWgrad:  // dW[out, in] += dy^T x, k = rows
      return linear_wgrad_shape(/*rows=*/k, /*in=*/n, /*out=*/m);
    case GemmRole::kForward:  // y[rows, out] = x[rows, in] W^T
    case GemmRole::kNone:
      break;
  }
  return linear_forward_shape(/*rows=*/m, /*in=*/k, /*out=*/n);
}

std::vector<GemmShape> model_gemm_shapes(const RankShape& d, bool has_layers, bool has_head) {
  std::set<GemmShape> shapes;
  const auto linear = [&](int64_t in, int64_t out) {
    shapes.insert(linear_forward_shape(d.tokens, in, out));
    shapes.insert(linear_dgrad_shape(d.tokens, in, out));
    shapes.insert(linear_wgrad_shape(d.tokens, in, out));
  };
  if (has_layers) {
    linear(d.hidden, d.qkv_width);  // fused QKV
    linear(d.q_width, d.hidden);    // output projection
    if (d.ffn > 0) {                // a MoE model has no dense MLP (job_gemm_shapes)
      linear(d.hidden, 2 * d.ffn);  // gate and up
      linear(d.ffn, d.hidden);      // down
    }
  }
  if (has_head) linear(d.hidden, d.vocab_local);
  return {shapes.begin(), shapes.end()};
}

std::vector<GemmShape> job_gemm_shapes(const JobSpec& job, int64_t rank, bool has_layers,
                                       bool has_head) {
  const RankShape d = rank_shape(job, rank);
  std::vector<GemmShape> dense = model_gemm_shapes(d, has_layers, has_head);
  if (!has_layers || !job.model.is_moe()) return dense;
  const MoeSpec& moe = *job.model.moe;
  std::set<GemmShape> shapes(dense.begin(), dense.end());
  const auto linear = [&](int64_t rows, int64_t in, int64_t out) {
    shapes.insert(linear_forward_shape(rows, in, out));
    shapes.insert(linear_dgrad_shape(rows, in, out));
    shapes.insert(linear_wgrad_shape(rows, in, out));
  };
  linear(d.rows, d.hidden, moe.num_experts);  // the router
  // runtime/model/moe_layers_padded.h: each local expert computes on the etp ep C padded
  // rows of the TP group's members (C = T without a capacity factor), 1/etp of its FFN.
  const int64_t capacity =
      kernels::expert_capacity(d.rows, moe.top_k, moe.num_experts, moe.capacity_factor);
  const int64_t etp = job.parallel.expert_tp_size();
  const int64_t rows = etp * job.parallel.ep * capacity;  // one local expert's padded rows
  const int64_t ffn = moe.expert_ffn_hidden_size / etp;
  linear(rows, d.hidden, 2 * ffn);
  linear(rows, ffn, d.hidden);
  if (moe.shared_expert_ffn_hidden_size > 0) {  // runtime/model/moe_shared_expert_padded.h
    const int64_t gathered = d.rows * d.tp, fs = moe.shared_expert_ffn_hidden_size / d.tp;
    linear(gathered, d.hidden, 2 * fs);  // fc1 on the TP group's rows
    linear(gathered, fs, d.hidden);      // fc2
    linear(d.rows, d.hidden, 1);         // the gate's logit on the own rows
  }
  return {shapes.begin(), shapes.end()};
}

std::optional<AttentionSetup> model_attention_setup(const RankShape& shape, bool has_layers,
                                                    CpCommType cp_comm_type, bool deterministic,
                                                    AttentionChoice choice) {
  if (!has_layers) return std::nullopt;
  AttentionSetup setup;
  if (shape.cp == 1) {
    setup.shape = {shape.micro_batch, shape.seq_shard, shape.heads, shape.kv_heads, shape.head_dim};
  } else if (cp_comm_type == CpCommType::kA2a) {
    // The head-split attention of Ulysses: plain causal attention, so cuDNN may serve it.
    setup.shape = {shape.micro_batch, shape.seq_shard * shape.cp, shape.heads / shape.cp,
                   shape.kv_heads / shape.cp, shape.head_dim};
  } else {
    return std::nullopt;  // ring steps only
  }
  setup.deterministic = deterministic;
  setup.choice = choice;
  return setup;
}

DevicePreparation prepare_device(DeviceApi& api, const std::vector<GemmShape>& gemm_shapes,
                                 const std::optional<AttentionSetup>& attention,
                                 StreamHandle compute) {
  DevicePreparation done;
  done.kernels = api.load_kernels();
  done.stack_bytes = std::max(done.kernels.max_stack_bytes, kDefaultStackBytes);
  api.set_stack_limit(done.stack_bytes);
  for (const GemmShape& shape : gemm_shapes) api.warm_gemm(shape, compute);
  done.gemm_shapes = static_cast<int64_t>(gemm_shapes.size());
  if (attention) done.attention = api.prepare_attention(*attention, compute);
  api.synchronize_device();
  return done;
}

}  // namespace dhelix::cuda
