#pragma once
// What the set-up runs on each NCCL communicator before iteration 1 (device_comms.h, step
// 4), and at which sizes.
//
// NCCL 2.22 and later connect lazily: a communicator's peers per algorithm (Ring, Tree,
// NVLS, PAT, ...) on the first collective that picks that algorithm, and point-to-point
// peers on the first send/receive (NCCL documentation, NCCL_RUNTIME_CONNECT). NCCL picks
// the algorithm and protocol per call from the operation and its size, so one 1-element
// all-reduce connects the algorithm of small all-reduces only, and the iteration's large
// all-gather / reduce-scatter would connect inside iteration 1, with pipeline receives
// already spinning on the GPU (docs/gpu.md, "iteration 1"). So every communicator runs
// every operation kind it will run in an iteration, each at three sizes: one element, the
// largest buffer the iteration moves on it, and one between (NCCL's tuning switches
// protocol and algorithm at sizes between those ends, so the middle catches a third
// choice). Sizes are capped at kMaxWarmupBytes: beyond a few MiB NCCL's choice no longer
// changes with the size, and the set-up's scratch buffer stays bounded.
//
// Every member of a communicator must run the same operations with the same counts in the
// same order, so the sizes come from the job alone (identical on every rank of a group),
// never from a rank's own buffers.

#include <cstdint>
#include <vector>

#include "lib/job_spec.h"
#include "runtime/cuda/device_api.h"
#include "runtime/train/gradient_reduction.h"

namespace dhelix::cuda {

/// What a communicator runs in an iteration.
enum class CommRole {
  kCollectives,  ///< all-gather, reduce-scatter and all-reduce (TP, DP, gradient groups,
                 ///< all-gather CP)
  kRing,         ///< the CP ring's step (a grouped send and receive)
  kAllToAll,     ///< the EP dispatch and combine, Ulysses' all-to-alls
  kSend,         ///< a pipeline channel's sending end
  kRecv,         ///< a pipeline channel's receiving end
};

/// The largest buffer, in elements, an iteration moves on each kind of communicator (the
/// full buffer: an all-gather's output, a reduce-scatter's input); 0 warms one element only.
struct CommWarmupSizes {
  int64_t tp = 0;         ///< bf16: sequence-parallel activations T x h, or the expert-TP
                          ///< blocks etp x E C h when larger
  int64_t cp = 0;         ///< bf16: the CP ring's largest message, K and V blocks and dK, dV
  int64_t cp_a2a = 0;     ///< bf16: a2a+p2p's all-to-all sub-groups: the fused QKV rows
  int64_t ep = 0;         ///< bf16: the all-to-all's blocks of every member (E x C x h)
  int64_t dp = 0;         ///< fp32: the largest dense gradient bucket (DP, DP x CP)
  int64_t expert_dp = 0;  ///< fp32: the largest expert gradient bucket (expert-data-parallel)
  int64_t channel = 0;    ///< bf16: a pipeline message, the residual stream of a micro-batch
  /// What the CP communicators run: the ring's steps (p2p), all-gathers and
  /// reduce-scatters (allgather: cp is then the gathered buffer, cp x 2 T kv_width) or
  /// all-to-alls (a2a: cp is then the fused QKV rows, T x qkv_width).
  CommRole cp_role = CommRole::kRing;
  auto operator<=>(const CommWarmupSizes&) const = default;
};

/// The activation sizes of `job`'s communicators on `rank` (the same on every member of
/// each); the gradient groups' from size_gradient_warmups.
CommWarmupSizes comm_warmup_sizes(const JobSpec& job, int64_t rank);

/// sizes.dp and sizes.expert_dp: the largest dense and expert bucket of `buckets`, the
/// rank's gradient buckets as the gradient reducer makes them (rt::reduction_buckets_of:
/// a bucket may exceed --ddp-bucket-size by its last parameter). The members of a gradient
/// group hold the same stage, hence the same buckets.
void size_gradient_warmups(CommWarmupSizes& sizes, const std::vector<rt::ReductionBucket>& buckets);

/// One warm-up operation: for kCollectives `op` says which collective; `count` is what the
/// DeviceCommunicator call takes (per member for all-gather, reduce-scatter and the
/// all-to-all's block capacity).
struct WarmupOp {
  CommRole role = CommRole::kCollectives;
  CollectiveOp op = CollectiveOp::kAllReduceSum;
  int64_t count = 1;
  DeviceDtype dtype = DeviceDtype::kFloat32;
  auto operator<=>(const WarmupOp&) const = default;
};

/// The most bytes one warm-up buffer holds (see the file comment).
inline constexpr int64_t kMaxWarmupBytes = int64_t{64} << 20;

/// The three sizes of the file comment for a largest buffer of `largest` elements of
/// `dtype`: ascending, without repeats ({1} when largest <= 1).
std::vector<int64_t> warmup_size_classes(int64_t largest, DeviceDtype dtype);

/// The warm-up of one communicator of `members` members that plays `role`, its largest
/// buffer `largest` elements of `dtype`: every kind of the role at each size class.
std::vector<WarmupOp> comm_warmup_ops(CommRole role, int64_t largest, DeviceDtype dtype,
                                      int64_t members);

/// Bytes of the larger buffer (input or output) of any op of `ops` on a communicator of
/// `members`: the warm-up's input and output buffers each hold this much.
int64_t warmup_buffer_bytes(const std::vector<WarmupOp>& ops, int64_t members);

}  // namespace dhelix::cuda
