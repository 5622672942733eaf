#include "profiler/cuda/cuda_op_plan.h"

#include <algorithm>
#include <cmath>

#include "lib/error.h"

namespace dhelix::cuda_profile {
namespace {

GemmLaunch gemm_of(const Op& op) {
  const OpShape& s = op.shape;
  return {.m = s.m,
          .n = s.n,
          .k = s.k,
          .batch = std::max<int64_t>(1, s.batch),
          .repeats = 1,
          .transpose_a = op.gemm_role == GemmRole::kWgrad,
          .transpose_b = op.gemm_role == GemmRole::kForward || op.gemm_role == GemmRole::kNone};
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
  return {.m = m,
          .n = std::max<int64_t>(1, n_total / repeats),
          .k = k,
          .batch = 1,
          .repeats = repeats,
          .transpose_a = false,
          .transpose_b = true};
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
  }
  return "unknown";
}

int64_t OpLaunchPlan::device_bytes() const {
  const int64_t width = dtype_bytes(dtype);
  switch (kind) {
    case LaunchKind::kGemm:
      return gemm.batch * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * width;
    case LaunchKind::kCopy:
      return 2 * copy_bytes;
    case LaunchKind::kAllGather:
    case LaunchKind::kReduceScatter:
      return (elements + elements / group_size) * width;
    case LaunchKind::kAllReduce:
    case LaunchKind::kAllToAll:
    case LaunchKind::kSendRecv:
      return 2 * elements * width;
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
      plan.gemm = gemm_of(op);
      return plan;
    case OpKind::kAttention:
      plan.kind = LaunchKind::kGemm;
      plan.gemm = attention_stand_in(op);
      plan.approximate = true;
      plan.stand_in = "gemm of the attention's flops";
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
