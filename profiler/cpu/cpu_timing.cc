#include "profiler/cpu/cpu_timing.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "lib/error.h"
#include "profiler/sampling.h"

namespace dhelix::cpu_profile {
namespace {

// Runs body once unless an earlier call failed; keeps the first exception.
void run_guarded(const std::function<void()>& body, std::exception_ptr& error) {
  if (error) return;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
}

}  // namespace

double steady_clock_us() {
  using Micro = std::chrono::duration<double, std::micro>;
  return Micro(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> time_samples(const TimingOptions& options,
                                 const std::function<void()>& before_each,
                                 const std::function<void()>& body, const ClockUs& clock) {
  DHELIX_CHECK(options.warmup >= 0 && options.samples >= 1);
  std::vector<double> samples;
  for (int64_t i = 0; i < options.warmup + options.samples; ++i) {
    before_each();
    const double start = clock();
    body();
    const double end = clock();
    if (i >= options.warmup) samples.push_back(end - start);
  }
  return samples;
}

std::vector<PairSample> time_pair_samples(const TimingOptions& options,
                                          const std::function<void()>& before_each,
                                          const std::function<void()>& body_a,
                                          const std::function<void()>& body_b,
                                          const ClockUs& clock) {
  DHELIX_CHECK(options.warmup >= 0 && options.samples >= 1);
  const int64_t runs = options.warmup + options.samples;
  std::vector<double> start_b(static_cast<size_t>(runs)), end_b(start_b.size());
  std::exception_ptr error_a, error_b;
  // Two phases per run: "start" releases both bodies together, "end" hands b's times to
  // the calling thread before the next run's before_each.
  std::barrier sync(2);
  std::thread helper([&] {
    for (size_t i = 0; i < start_b.size(); ++i) {
      sync.arrive_and_wait();
      start_b[i] = clock();
      run_guarded(body_b, error_b);
      end_b[i] = clock();
      sync.arrive_and_wait();
    }
  });
  std::vector<PairSample> samples;
  for (int64_t i = 0; i < runs; ++i) {
    const auto index = static_cast<size_t>(i);
    if (!error_a) run_guarded(before_each, error_a);
    sync.arrive_and_wait();
    const double start_a = clock();
    run_guarded(body_a, error_a);
    const double end_a = clock();
    sync.arrive_and_wait();
    const double start = std::min(start_a, start_b[index]);
    if (i >= options.warmup) samples.push_back({end_a - start, end_b[index] - start});
  }
  helper.join();
  if (error_a) std::rethrow_exception(error_a);
  if (error_b) std::rethrow_exception(error_b);
  return samples;
}

ProfiledPair pair_from_samples(const std::string& a, const std::string& b, double solo_a_us,
                               double solo_b_us, const std::vector<PairSample>& samples,
                               PairAdjustment* adjustment) {
  DHELIX_CHECK(!samples.empty() && solo_a_us >= 0 && solo_b_us >= 0);
  std::vector<double> finish_a, finish_b;
  for (const PairSample& s : samples) {
    finish_a.push_back(s.finish_a_us);
    finish_b.push_back(s.finish_b_us);
  }
  PairAdjustment applied = PairAdjustment::kNone;
  // The reader recomputes the OEF from the quantized solo medians: work with those.
  const double t_a = quantize_profile_value(solo_a_us);
  const double t_b = quantize_profile_value(solo_b_us);
  double f_a = quantize_profile_value(sampling::median(finish_a));
  double f_b = quantize_profile_value(sampling::median(finish_b));
  if (f_a < t_a || f_b < t_b) applied = PairAdjustment::kRaisedToSolo;
  f_a = std::max(f_a, t_a);
  f_b = std::max(f_b, t_b);
  const double cap = quantize_profile_value(std::max(t_a, t_b) + 2 * std::min(t_a, t_b));
  if (std::max(f_a, f_b) > cap) {
    applied = PairAdjustment::kCappedAtOefMinusOne;
    f_a = std::min(f_a, cap);
    f_b = std::min(f_b, cap);
  }
  if (adjustment != nullptr) *adjustment = applied;
  const double makespan = std::max(f_a, f_b);
  const double oef = std::clamp(overlap_effectiveness(t_a, t_b, makespan), -1.0, 1.0);
  return {.a = a,
          .b = b,
          .finish_a_us = f_a,
          .finish_b_us = f_b,
          .makespan_us = makespan,
          .oef = quantize_profile_value(oef)};
}

}  // namespace dhelix::cpu_profile
