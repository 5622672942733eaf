#include "runtime/cuda/comm_warmup.h"

#include <algorithm>
#include <set>

#include "lib/rank_shape.h"
#include "runtime/kernels/moe_capacity.h"

namespace dhelix::cuda {
namespace {

// The middle size class: 1/64 of the largest, between NCCL's small-message (LL) and
// large-message (Simple) choices for buffers of a few MiB.
constexpr int64_t kMiddleDivisor = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

CommWarmupSizes comm_warmup_sizes(const JobSpec& job, int64_t rank) {
  const RankShape d = rank_shape(job, rank);
  CommWarmupSizes sizes;
  sizes.tp = d.full_elements();
  // The backward ring's middle messages carry a K/V block and a dK/dV partial
  // (runtime/model/layer_ops_cp.h, cp_message): two blocks of 2 T kv_width.
  sizes.cp = 2 * (2 * d.tokens * d.kv_width);
  // All-gather CP (runtime/model/layer_ops_kv_allgather.h): every rank's K/V block; Ulysses
  // (layer_ops_ulysses.h): its largest all-to-all, the fused QKV rows.
  if (job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kAllGather) {
    sizes.cp_role = CommRole::kCollectives;
    sizes.cp = job.parallel.cp * 2 * d.tokens * d.kv_width;
  } else if (job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kA2a) {
    sizes.cp_role = CommRole::kAllToAll;
    sizes.cp = d.tokens * d.qkv_width;
  } else if (job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kA2aP2p) {
    // The ring over the sub-groups moves A·T tokens of kv_width / A: the same blocks.
    sizes.cp_a2a = d.tokens * d.qkv_width;
  }
  if (job.model.is_moe()) {
    const MoeSpec& moe = *job.model.moe;
    const int64_t capacity =
        kernels::expert_capacity(d.rows, moe.top_k, moe.num_experts, moe.capacity_factor);
    // Every member's block: ep x (E / ep experts x C rows x h) = E C h.
    sizes.ep = moe.num_experts * capacity * d.hidden;
    // Expert tensor parallelism gathers and reduce-scatters every TP member's padded block
    // of E C h over the TP group (runtime/model/moe_expert_tp_padded.h).
    const int64_t etp = job.parallel.expert_tp_size();
    if (etp > 1) sizes.tp = std::max(sizes.tp, etp * sizes.ep);
  }
  sizes.channel = d.residual_elements();
  return sizes;
}

void size_gradient_warmups(CommWarmupSizes& sizes,
                           const std::vector<rt::ReductionBucket>& buckets) {
  sizes.dp = 0;
  sizes.expert_dp = 0;
  for (const rt::ReductionBucket& bucket : buckets) {
    int64_t& largest = bucket.expert ? sizes.expert_dp : sizes.dp;
    largest = std::max(largest, bucket.elements);
  }
}

std::vector<int64_t> warmup_size_classes(int64_t largest, DeviceDtype dtype) {
  const int64_t most = kMaxWarmupBytes / device_dtype_bytes(dtype);
  const int64_t top = std::clamp<int64_t>(largest, 1, most);
  const std::set<int64_t> sizes = {1, std::max<int64_t>(top / kMiddleDivisor, 1), top};
  return {sizes.begin(), sizes.end()};
}

std::vector<WarmupOp> comm_warmup_ops(CommRole role, int64_t largest, DeviceDtype dtype,
                                      int64_t members) {
  std::vector<WarmupOp> ops;
  for (const int64_t size : warmup_size_classes(largest, dtype)) {
    // All-gather, reduce-scatter and the all-to-all take each member's share of the full
    // buffer; the others the buffer itself.
    const int64_t share = ceil_div(size, members);
    switch (role) {
      case CommRole::kCollectives:
        for (const CollectiveOp op : {CollectiveOp::kAllGather, CollectiveOp::kReduceScatterSum}) {
          ops.push_back({.role = role, .op = op, .count = share, .dtype = dtype});
        }
        ops.push_back(
            {.role = role, .op = CollectiveOp::kAllReduceSum, .count = size, .dtype = dtype});
        break;
      case CommRole::kAllToAll:
        ops.push_back({.role = role, .count = share, .dtype = dtype});
        break;
      case CommRole::kRing:
      case CommRole::kSend:
      case CommRole::kRecv:
        ops.push_back({.role = role, .count = size, .dtype = dtype});
        break;
    }
  }
  return ops;
}

int64_t warmup_buffer_bytes(const std::vector<WarmupOp>& ops, int64_t members) {
  int64_t bytes = 0;
  for (const WarmupOp& op : ops) {
    // members x count for the all-gather's output, the reduce-scatter's input and the
    // all-to-all's blocks; count for the others.
    const bool shared = op.role == CommRole::kAllToAll ||
                        (op.role == CommRole::kCollectives && op.op != CollectiveOp::kAllReduceSum);
    bytes = std::max(bytes, (shared ? members : 1) * op.count * device_dtype_bytes(op.dtype));
  }
  return bytes;
}

}  // namespace dhelix::cuda
