#include "profiler/cpu/cpu_timing.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>
#include <tuple>
#include <utility>

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

constexpr double kMinRate = 1e-3;

}  // namespace

PairRepeats pair_repeats(double solo_a_us, double solo_b_us) {
  if (solo_a_us <= 0 || solo_b_us <= 0) return {};
  auto times = [](double longer, double shorter) {
    return std::clamp<int64_t>(std::llround(longer / shorter), 1, kMaxPairRepeats);
  };
  if (solo_a_us < solo_b_us) return {.a = times(solo_b_us, solo_a_us), .b = 1};
  return {.a = 1, .b = times(solo_a_us, solo_b_us)};
}

PairSample single_op_equivalent(const PairSample& sequences, double solo_a_us, double solo_b_us,
                                const PairRepeats& repeats) {
  DHELIX_CHECK(solo_a_us > 0 && solo_b_us > 0 && repeats.a >= 1 && repeats.b >= 1);
  DHELIX_CHECK(sequences.finish_a_us > 0 && sequences.finish_b_us > 0);
  const double work_a = solo_a_us * static_cast<double>(repeats.a);
  const double work_b = solo_b_us * static_cast<double>(repeats.b);
  // Rates of the sequences: the first to end ran co-scheduled all its life.
  auto rates = [](double work_first, double finish_first, double work_second,
                  double finish_second) {
    const double done_second = work_second - (finish_second - finish_first);
    return std::pair{std::max(kMinRate, work_first / finish_first),
                     std::max(kMinRate, done_second / finish_first)};
  };
  double rate_a = 0, rate_b = 0;
  if (sequences.finish_a_us <= sequences.finish_b_us) {
    std::tie(rate_a, rate_b) = rates(work_a, sequences.finish_a_us, work_b, sequences.finish_b_us);
  } else {
    std::tie(rate_b, rate_a) = rates(work_b, sequences.finish_b_us, work_a, sequences.finish_a_us);
  }
  // One op of each at those rates: the first ends alone at T / r, the other then runs alone.
  const double end_a = solo_a_us / rate_a, end_b = solo_b_us / rate_b;
  if (end_a <= end_b) return {end_a, end_a + std::max(0.0, solo_b_us - rate_b * end_a)};
  return {end_b + std::max(0.0, solo_a_us - rate_a * end_b), end_b};
}

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
  // The run whose body b has started. Body a waits for it: a helper the scheduler wakes
  // late (it shares the rank's core with a, which would keep it for a whole time slice)
  // would otherwise start b after a ended, and the pair would time the harness, not a co-run.
  std::atomic<int64_t> b_started{-1};
  std::thread helper([&] {
    for (size_t i = 0; i < start_b.size(); ++i) {
      sync.arrive_and_wait();
      start_b[i] = clock();
      b_started.store(static_cast<int64_t>(i), std::memory_order_release);
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
    while (b_started.load(std::memory_order_acquire) < i) std::this_thread::yield();
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

}  // namespace dhelix::cpu_profile
