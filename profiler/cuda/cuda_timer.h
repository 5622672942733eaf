#pragma once
// Timing with CUDA events on the current device, the way the DHelix paper measures solo
// times and co-run pairs (section 3.2).
//
// Every sample starts on a dedicated start stream: it waits until the previous sample has
// finished on every stream, fills an L2 flush buffer of twice the GPU's L2 size
// (cudaMemsetAsync, so no op finds its operands in L2 left by the previous run), then
// records the start event. The op streams wait on that event and record each op's end
// event. A sample is the time from the start event to each end event; the flush also
// covers the host's launch of the ops, so the GPU never waits on the CPU inside a sample.
//
// Solo: one op on its stream. Pair: two ops on two streams released by the same start
// event, each with its own end event (the finish times of lib/profile.h).
//
// Streams: compute at the default priority, two communication streams at the highest
// priority (as runtime/cuda's executor runs them), so that a compute x communication pair
// and a local x cross-node communication pair run on the streams they run on in training.

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace dhelix::cuda_profile {

/// Enqueues one run of an op on `stream` without waiting for it.
using Enqueue = std::function<void(cudaStream_t stream)>;

/// Which stream an op runs on.
enum class StreamRole { kCompute, kComm0, kComm1 };

/// When each op of a co-run ended, microseconds after their common start.
struct CoRunSample {
  double finish_a_us = 0;
  double finish_b_us = 0;
};

class CudaTimer {
 public:
  /// Creates the streams and a flush buffer of 2 x `l2_bytes` on the current device.
  explicit CudaTimer(int64_t l2_bytes);
  ~CudaTimer();
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;

  cudaStream_t stream(StreamRole role) const;

  /// Runs `op` `runs` times; returns each run's time, microseconds, in run order.
  /// `before_each` (may be empty) is called with the device idle before each run: an MPI
  /// barrier, so that the ranks of a collective start together. Without it the runs are
  /// queued back to back and waited for once.
  std::vector<double> time_solo(const Enqueue& op, StreamRole role, int64_t runs,
                                const std::function<void()>& before_each);

  /// Runs `a` and `b` together `runs` times on streams `role_a` != `role_b`.
  std::vector<CoRunSample> time_pair(const Enqueue& a, StreamRole role_a, const Enqueue& b,
                                     StreamRole role_b, int64_t runs,
                                     const std::function<void()>& before_each);

  /// The longest time, microseconds, from a start event to an op's first work seen so far:
  /// the launch lag the flush did not cover (should stay at a few microseconds).
  double max_start_lag_us() const { return max_start_lag_us_; }

 private:
  // Runs the ops of one sample set; `ops` has one or two entries.
  std::vector<std::vector<double>> time_runs(const std::vector<const Enqueue*>& ops,
                                             const std::vector<StreamRole>& roles, int64_t runs,
                                             const std::function<void()>& before_each);

  cudaStream_t start_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_[2] = {nullptr, nullptr};
  void* flush_ = nullptr;
  int64_t flush_bytes_ = 0;
  double max_start_lag_us_ = 0;
};

}  // namespace dhelix::cuda_profile
