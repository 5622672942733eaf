#include "profiler/cuda/cuda_op_plan.h"

#include <algorithm>
#include <cmath>

#include "lib/error.h"
#include "runtime/cuda/device_setup.h"

namespace dhelix::cuda_profile {
namespace {

GemmLaunch gemm_of(const Op& op) {
  const OpShape& s = op.shape;
  // The router is a fused op without a role; its backward's GEMM has the dgrad's shape
  // (lib/dag_builder_moe.cc, make_router) and the runtime runs a dgrad there.
  const GemmRole role =
      op.kind == OpKind::kRouter && op.pass == Pass::kBackward ? GemmRole::kDgrad : op.gemm_role;
  return {.call = cuda::gemm_shape_of_role(role, s.m, s.n, s.k),
          .batch = std::max<int64_t>(1, s.batch),
          .repeats = 1};
}

// GEMMs with the attention's FLOPs (half of them under a causal mask, as a flash kernel
// skips the masked blocks; docs/cost-model.md).
GemmLaunch attention_stand_in(const Op& op) {
  const OpShape& s = op.shape;
  const int64_t m = std::max<int64_t>(1, s.batch * s.q_len);
  const int64_t k = std::max<int64_t>(1, s.heads * s.head_dim);
  const double flops = s.causal ? op.flops / 2 : op.flops;
  const auto n_total =
      std::max<int64_t>(1, std::llround(flops / (2.0 * static_cast<double>(m * k))));
  const int64_t repeats = (n_total + kMaxStandInColumns - 1) / kMaxStandInColumns;
  return {.call = cuda::linear_forward_shape(/*rows=*/m, /*in=*/k,
                                             /*out=*/std::max<int64_t>(1, n_total / repeats)),
          .batch = 1,
          .repeats = repeats};
}

// Whether runtime/cuda's attention kernels take the op's shape (launch_config.h: causal
// self-attention, an even head_dim up to 256, heads and batch within a grid dimension).
bool runs_dhelix_attention(const OpShape& s) {
  constexpr int64_t kMaxHeadDim = 256;
  constexpr int64_t kMaxGridYZ = 65535;
  return s.causal && s.q_len == s.kv_len && s.q_len > 0 && s.head_dim >= 2 &&
         s.head_dim <= kMaxHeadDim && s.head_dim % 2 == 0 && s.kv_heads >= 1 &&
         s.heads % s.kv_heads == 0 && s.heads <= kMaxGridYZ && s.batch <= kMaxGridYZ;
}

// A CP ring step's op (lib/dag_builder_cp.cc: fwd.attn_step<i>, bwd.attn_step<i>) on a
// shape the ring kernels take: the local sequence is two chunks. Its step index, else -1.
int64_t ring_step_index(const Op& op) {
  const std::string::size_type at = op.id.find(".attn_step");
  if (at == std::string::npos || !runs_dhelix_attention(op.shape) || op.shape.q_len % 2 != 0) {
    return -1;
  }
  const std::string digits = op.id.substr(at + std::string(".attn_step").size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

LaunchKind collective_launch(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
      return LaunchKind::kAllGather;
    case OpKind::kReduceScatter:
      return LaunchKind::kReduceScatter;
    case OpKind::kAllReduce:
      return LaunchKind::kAllReduce;
    case OpKind::kAllToAll:
      return LaunchKind::kAllToAll;
    case OpKind::kSendRecv:
      return LaunchKind::kSendRecv;
    default:
      DHELIX_CHECK_MSG(false, std::string("not a collective: ") + op_kind_name(kind));
  }
  return LaunchKind::kAllReduce;
}

}  // namespace

const char* launch_kind_name(LaunchKind kind) {
  switch (kind) {
    case LaunchKind::kGemm:
      return "gemm";
    case LaunchKind::kCopy:
      return "copy";
    case LaunchKind::kAllGather:
      return "all_gather";
    case LaunchKind::kReduceScatter:
      return "reduce_scatter";
    case LaunchKind::kAllReduce:
      return "all_reduce";
    case LaunchKind::kAllToAll:
      return "all_to_all";
    case LaunchKind::kSendRecv:
      return "send_recv";
    case LaunchKind::kAttention:
      return "attention";
  }
  return "unknown";
}

std::vector<GemmCallAt> gemm_calls(const GemmLaunch& launch) {
  const cuda::GemmShape& g = launch.call;
  std::vector<GemmCallAt> calls;
  for (int64_t r = 0; r < launch.repeats; ++r) {
    for (int64_t e = 0; e < launch.batch; ++e) {
      calls.push_back({.call = g, .a = e * g.m * g.k, .b = e * g.k * g.n, .c = e * g.m * g.n});
    }
  }
  return calls;
}

int64_t OpLaunchPlan::device_bytes() const {
  const int64_t width = dtype_bytes(dtype);
  switch (kind) {
    case LaunchKind::kGemm: {
      const cuda::GemmShape& g = gemm.call;
      return gemm.batch * ((g.m * g.k + g.k * g.n) * 2 + g.m * g.n * (g.fp32_output ? 4 : 2));
    }
    case LaunchKind::kCopy:
      return 2 * copy_bytes;
    case LaunchKind::kAllGather:
    case LaunchKind::kReduceScatter:
      return (elements + elements / group_size) * width;
    case LaunchKind::kAllReduce:
    case LaunchKind::kAllToAll:
    case LaunchKind::kSendRecv:
      return 2 * elements * width;
    case LaunchKind::kAttention: {
      const AttentionLaunch& a = attention;
      const int64_t q = a.batch * a.seq * a.heads * a.head_dim * 2;  // bf16
      const int64_t kv = a.batch * a.seq * a.kv_heads * a.head_dim * 2;
      const int64_t rows = a.batch * a.heads * a.seq * 4;  // fp32 lse (and delta)
      // q, k, v, out, lse; the backward adds dout, dq, dk, dv and delta. A ring step also
      // keeps the forward's state: (max, sum) per row and the fp32 accumulator.
      const int64_t state = a.ring_step ? 2 * rows + 2 * q : 0;
      return (a.backward ? 4 * q + 4 * kv + 2 * rows : 2 * q + 2 * kv + rows) + state;
    }
  }
  return 0;
}

OpLaunchPlan plan_cuda_op(const Op& op) {
  OpLaunchPlan plan;
  plan.dtype = op.dtype;
  if (is_communication(op.kind)) {
    if (op.group_size < 2) {
      throw Error(ErrorCode::kUnsupported, op.signature() + ": a group of " +
                                               std::to_string(op.group_size) +
                                               " rank has nothing to communicate");
    }
    plan.kind = collective_launch(op.kind);
    plan.group_size = op.group_size;
    const int64_t elements = op.comm_bytes / dtype_bytes(op.dtype);
    plan.elements = elements / op.group_size * op.group_size;
    return plan;
  }
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kHead:
    case OpKind::kRouter:
    case OpKind::kGroupedGemm:
      plan.kind = LaunchKind::kGemm;
      plan.dtype = DType::kBf16;  // the runtime's GEMMs read bf16 (device_api.h)
      plan.gemm = gemm_of(op);
      return plan;
    case OpKind::kAttention:
      if (runs_dhelix_attention(op.shape)) {
        plan.kind = LaunchKind::kAttention;
        plan.dtype = DType::kBf16;  // the kernels' type
        plan.attention = {.batch = std::max<int64_t>(1, op.shape.batch),
                          .seq = op.shape.q_len,
                          .heads = op.shape.heads,
                          .kv_heads = op.shape.kv_heads,
                          .head_dim = op.shape.head_dim,
                          .backward = op.pass == Pass::kBackward};
        if (const int64_t step = ring_step_index(op); step >= 0) {
          plan.attention.ring_step = true;
          plan.attention.diagonal = step == 0;
        }
        return plan;
      }
      plan.kind = LaunchKind::kGemm;
      plan.dtype = DType::kBf16;
      plan.gemm = attention_stand_in(op);
      plan.approximate = true;
      plan.stand_in =
          "gemm of the attention's flops (dhelix's attention kernels take causal "
          "self-attention with q_len == kv_len only)";
      return plan;
    default:
      plan.kind = LaunchKind::kCopy;
      plan.copy_bytes = std::max<int64_t>(1, (op.bytes_read + op.bytes_written) / 2);
      plan.approximate = true;
      plan.stand_in = "device copy of the op's memory traffic";
      return plan;
  }
}

}  // namespace dhelix::cuda_profile
