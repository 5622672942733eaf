#pragma once
// The CUDA backend's data-parallel gradient reduction: the CPU engine's
// (runtime/train/gradient_reduction.h; read it first) on streams instead of a thread, with
// the same buckets (reduction_buckets_of: the parameters ordered by when the co-executed
// program finishes their gradients, cut at --ddp-bucket-size; the MoE experts' apart under
// EP, over the expert-data-parallel group) and the same fixed summation order.
//
// Streams. The reducer has a stream of its own (DeviceStreams::reduction_stream), and the
// DP (or DP x CP) and expert-data-parallel communicators run there and nowhere else (one
// communicator per stream, device_comms.h). A bucket is issued right after the instruction
// that finishes it is enqueued (the executor's after_instruction hook), on that
// instruction's stream (compute: every gradient writer is a compute op):
//   1. the TP sums of the bucket's parameters that need one (the norm gains under sequence
//      parallelism, the MoE router), on compute with the compute stream's TP communicator;
//   2. an event recorded there, which the reduction stream waits on: the bucket's
//      gradients are final;
//   3. on the reduction stream: the gradients packed back to back into a staging buffer
//      (device copies), one all-reduce over the bucket's group, and the sums copied back (a
//      bucket of one parameter is summed in place); with the distributed optimizer the
//      packed bucket, zero-padded to members x shard, is reduce-scattered into this rank's
//      shard (runtime/train/bucket_shards.h) and the gradients keep the local sums.
// Buckets are issued in bucket order, each when its last writer has been enqueued in the
// program being run (the sequential program finishes them in another order; a bucket then
// waits for the one before it), so every member of a group enqueues the same collectives
// in the same order. Without overlap every bucket is issued the same way in finish(),
// after the iteration, from the compute stream.
//
// Bits: the same collectives on the same communicators over the same packed data, only
// enqueued earlier: with NCCL's algorithm and protocol pinned (NCCL_ALGO, NCCL_PROTO;
// docs/gpu.md) the sums are those of the after-iteration path bit for bit. NCCL's
// reduce-scatter need not add in the all-reduce's order, so the distributed optimizer's
// weights equal the replicated optimizer's to rounding on a GPU, not bit for bit as on the
// CPU (whose collectives add in rank order); --verify compares runs of one configuration.
//
// Distributed optimizer: step() runs AdamW on this rank's shard of each bucket on the
// reduction stream (after the reductions, in stream order) and copies the updated shard
// aside, then all-gathers the weights bucket by bucket, last bucket first (the next
// forward's order), each followed by its compute copies' refresh and an event. Without
// overlap_gather the compute stream waits for the last gather; with it, an instruction's
// stream waits (the before_instruction hook) only for the buckets of the parameters it may
// read (rt::buckets_read_by, as the CPU's), so the first layers' forward starts while the
// later buckets are still being gathered.
//
// Host waits: none inside an iteration. The gradients may be read on the host or zeroed
// after synchronize() (a host wait for the reduction stream, through a communicator, so
// that an asynchronous NCCL error is reported) or after the engine's update() has waited
// for finish()'s (or step()'s) event through the compute stream.
//
// Kernels (AdamW, the compute copies' refresh) are the engine's (DeviceOptimizerKernels),
// so that this file holds no CUDA call and runs on the recording device of tests/device.

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/kernels/adamw.h"
#include "runtime/train/gradient_reduction.h"

namespace dhelix::cuda {

/// A parameter as the reducer sees it: fp32 values and gradient in device memory.
struct DeviceParameter {
  std::string name;
  float* values = nullptr;
  float* gradient = nullptr;
  int64_t count = 0;
  bool sum_gradient_over_tp = false;
  bool expert = false;
};

/// The kernels the distributed optimizer's step and gathers launch.
struct DeviceOptimizerKernels {
  /// AdamW `step` on parameter p's elements [offset, offset + count) from gradient[count]
  /// and the moments first[count], second[count], its compute copy rewritten there too.
  std::function<void(const kernels::AdamWStep& step, size_t p, int64_t offset, int64_t count,
                     const float* gradient, float* first, float* second, StreamHandle stream)>
      adamw;
  /// Rewrites parameter p's compute copy from its fp32 values.
  std::function<void(size_t p, StreamHandle stream)> refresh;
};

/// The communicators a reduction uses.
struct DeviceReductionGroups {
  /// The compute stream's TP communicator; null with tp = 1.
  DeviceCommunicator* tp = nullptr;
  /// DP (or DP x CP), run on the reduction stream; null without one (dp x cp = 1).
  DeviceCommunicator* dense = nullptr;
  /// The expert-data-parallel group, run on the reduction stream; null without EP.
  DeviceCommunicator* expert = nullptr;
};

/// `count` floats of device memory, zeroed (set-up only).
using DeviceFloats = std::function<float*(int64_t count)>;

class DeviceGradientReducer {
 public:
  /// Allocates its buffers (staging, the shards) through `allocate` and creates its events.
  /// `reduction`: the reduction stream; null when the rank has no data-parallel group
  /// (then only the TP sums run, and `sharded` must be false).
  DeviceGradientReducer(DeviceApi& api, std::vector<DeviceParameter> params,
                        std::vector<rt::ReductionBucket> buckets, DeviceReductionGroups groups,
                        StreamHandle compute, StreamHandle reduction, bool sharded,
                        const DeviceFloats& allocate, DeviceOptimizerKernels kernels = {});
  ~DeviceGradientReducer();
  DeviceGradientReducer(const DeviceGradientReducer&) = delete;
  DeviceGradientReducer& operator=(const DeviceGradientReducer&) = delete;

  /// The executor's hooks for one execution (DeviceExecutionOptions).
  struct Hooks {
    std::function<void(size_t, StreamHandle)> before_instruction;  ///< gather waits
    std::function<void(size_t, StreamHandle)> after_instruction;   ///< bucket reductions
  };
  /// Before an execution of `program`: every bucket pending. With `overlap` the hooks issue
  /// each bucket once its last writer is enqueued; before_instruction is set while
  /// overlapped gathers are pending (see the file comment).
  Hooks start(const RankProgram& program, bool overlap);
  /// Issues every bucket not issued yet (from the compute stream), then makes the compute
  /// stream wait for the reductions. Nothing more when called again before start().
  void finish();
  /// Distributed optimizer, after finish(): AdamW step `step` on this rank's shards, then
  /// the weights' gathers (see the file comment); the compute stream waits for the step,
  /// and for the gathers too unless `overlap_gather`.
  void step(const kernels::AdamWStep& step, bool overlap_gather);
  /// Host wait for everything enqueued on the reduction stream (no-op without one).
  void synchronize();

  const std::vector<rt::ReductionBucket>& buckets() const { return buckets_; }
  bool sharded() const { return sharded_; }
  /// Members of the dense buckets' group, of the experts' (1 without the group).
  int64_t dense_group_size() const { return groups_.dense ? groups_.dense->size() : 1; }
  int64_t expert_group_size() const { return groups_.expert ? groups_.expert->size() : 1; }
  /// Sharded: elements of moments this rank holds (per moment), of every bucket or of the
  /// experts' buckets only.
  int64_t shard_elements_held(bool experts_only = false) const;
  /// Sharded: every parameter's whole first (or `second`) moment, all-gathered bucket by
  /// bucket on the reduction stream; take(p, device pointer to its count elements) after a
  /// host wait, before the next bucket reuses the staging buffer. Collective over every
  /// bucket's group.
  void gather_moments(bool second, const std::function<void(size_t, const float*)>& take);
  /// Sharded: this rank's pieces of parameter p's moments.
  struct MomentPiece {
    int64_t offset = 0;  ///< in the parameter
    int64_t count = 0;
    float* first = nullptr;  ///< device memory, count elements
    float* second = nullptr;
  };
  std::vector<MomentPiece> moment_pieces(size_t p) const;

 private:
  struct ProgramView {                        // per program, cached by address
    std::vector<int64_t> last_writer;         // per bucket
    std::vector<std::vector<int32_t>> reads;  // per instruction
  };
  const ProgramView& view_of(const RankProgram& program);
  void issue_ready(size_t index, StreamHandle stream);
  void issue(size_t bucket, StreamHandle stream);
  void reduce_on_stream(size_t bucket);
  void wait_for_gathers(size_t index, StreamHandle stream);
  DeviceCommunicator* group_of(size_t bucket) const;  // null: nothing to sum
  int64_t shard_of(size_t bucket) const;
  template <class Visit>
  void for_each_piece(size_t bucket, Visit&& visit) const;
  void copy(void* to, const void* from, int64_t floats, StreamHandle stream);

  DeviceApi& api_;
  std::vector<DeviceParameter> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> counts_;
  std::vector<rt::ReductionBucket> buckets_;
  DeviceReductionGroups groups_;
  StreamHandle compute_;
  StreamHandle reduction_;
  bool sharded_;
  DeviceOptimizerKernels kernels_;
  float* staging_ = nullptr;
  float* zeros_ = nullptr;  // the padding of a reduce-scatter
  std::vector<float*> shard_gradients_, first_, second_, updated_;  // sharded: per bucket
  std::vector<EventHandle> ready_, gathered_;                       // per bucket
  EventHandle reduced_ = nullptr;  // after the last reduction (and the step)
  EventHandle all_gathered_ = nullptr;
  std::vector<std::pair<const RankProgram*, ProgramView>> views_;
  const ProgramView* current_ = nullptr;
  size_t next_ = 0;                // the next bucket to issue
  bool reduced_recorded_ = false;  // by this execution's reductions
  bool gathers_pending_ = false;
  std::set<std::pair<StreamHandle, int32_t>> waited_;  // this execution's gather waits
};

}  // namespace dhelix::cuda
