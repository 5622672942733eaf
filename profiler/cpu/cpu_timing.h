#pragma once
// The timing harness of the cpu profiler backend: runs a body a few times to warm caches
// and allocators, then times N samples, each after a caller-given synchronisation (an MPI
// barrier, so that every rank starts a sample together). It only produces samples; their
// statistics are profiler/sampling.h's, shared with the cuda backend.
//
// Pairs: the two bodies run on two threads released together by a std::barrier after the
// synchronisation, the calling thread's body once the helper's has started (a helper woken
// on a core the caller keeps busy could otherwise start only when the caller's body ended:
// a third of the emulated-link pairs did); a sample is the two finish times measured from
// the earlier of the two starts. Over samples, each finish time is summarised by its median
// separately (the pair format stores one finish time per op, lib/profile.h).
//
// Ops of very different lengths: in a run, a collective beside computation has computation
// beside it from start to end (an SI block's compute stream runs op after op), but a 2 ms
// collective started together with a 0.3 ms GEMM has the core to itself for its last
// 1.7 ms, and a slowdown of the collective by the GEMM hides in the noise. So the shorter op
// runs back to back as many times as the longer op lasts (pair_repeats: 2000 us beside
// 300 us gives 7 GEMMs), each stream's sequence is timed, and the sequences' finish times
// are turned into those of one op of each (single_op_equivalent) with the constant-rate
// model the planner reads pairs with (planner/co_run_model.h): the op that ends first ran
// beside the other all its life, at rate r_first = T_first / f_first; the other did
// T_second - (f_second - f_first) of its work in that time. Example: solo 100 us (x10) and
// 1000 us (x1); sequences end at 1250 and 1625 us: rates 0.8 and 0.5, so one op of each,
// started together, ends at 125 and 125 + 1000 - 0.5 * 125 = 1062.5 us.

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

/// How many times each op of a pair runs back to back in one sample.
struct PairRepeats {
  int64_t a = 1;
  int64_t b = 1;
};

/// Longest sequence of one op in a pair sample.
inline constexpr int64_t kMaxPairRepeats = 1000;

/// The shorter op runs round(T_long / T_short) times (at least 1, at most kMaxPairRepeats),
/// the longer once; solo medians in us, 1 and 1 when either is not positive.
PairRepeats pair_repeats(double solo_a_us, double solo_b_us);

/// Finish times of one op of each (solo medians solo_a_us, solo_b_us, both > 0) started
/// together, from a sample of their sequences (repeats), under the constant-rate model
/// (file comment). A rate is kept at least 1e-3, so every op ends; rates above 1 (a
/// sequence faster than its solo median, noise) are kept, for pair_from_samples to raise.
PairSample single_op_equivalent(const PairSample& sequences, double solo_a_us, double solo_b_us,
                                const PairRepeats& repeats);

// Pairs of finish times into a profile entry: sampling::pair_from_samples.
using sampling::pair_from_samples;
using sampling::PairAdjustment;

}  // namespace dhelix::cpu_profile
