#pragma once
// The timing harness of the cpu profiler backend: runs a body a few times to warm caches
// and allocators, then times N samples, each after a caller-given synchronisation (an MPI
// barrier, so that every rank starts a sample together). It only produces samples; their
// statistics are profiler/sampling.h's, shared with the cuda backend.
//
// Pairs: the two bodies run on two threads released together by a std::barrier after the
// synchronisation; a sample is the two finish times measured from the earlier of the two
// starts. Over samples, each finish time is summarised by its median separately (the pair
// format stores one finish time per op, lib/profile.h).

#include <cstdint>
#include <functional>
#include <vector>

#include "lib/profile.h"
#include "profiler/sampling.h"

namespace dhelix::cpu_profile {

/// A monotonic clock in microseconds; tests pass a fake one. Must be callable from two
/// threads at once (pairs).
using ClockUs = std::function<double()>;

/// std::chrono::steady_clock in microseconds since an arbitrary epoch.
double steady_clock_us();

/// How many runs of a body are thrown away and how many are kept.
struct TimingOptions {
  int64_t warmup = 1;   ///< untimed runs first (>= 0)
  int64_t samples = 5;  ///< timed runs (>= 1)
};

/// Runs before_each then body, warmup + samples times; returns the samples' durations of
/// body (before_each not included), in run order.
std::vector<double> time_samples(const TimingOptions& options,
                                 const std::function<void()>& before_each,
                                 const std::function<void()>& body, const ClockUs& clock);

/// One co-run: when each body ended, microseconds after the earlier of the two starts.
using sampling::PairSample;  // profiler/sampling.h

/// Runs before_each on the calling thread, then body_a on the calling thread and body_b on
/// a second thread started together, warmup + samples times. Returns the kept samples in
/// run order. An exception from either body is rethrown after both threads have finished
/// every iteration (a failed body is not called again).
std::vector<PairSample> time_pair_samples(const TimingOptions& options,
                                          const std::function<void()>& before_each,
                                          const std::function<void()>& body_a,
                                          const std::function<void()>& body_b,
                                          const ClockUs& clock);

// Pairs of finish times into a profile entry: sampling::pair_from_samples.
using sampling::pair_from_samples;
using sampling::PairAdjustment;

}  // namespace dhelix::cpu_profile
