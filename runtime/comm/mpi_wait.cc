#include "runtime/comm/mpi_wait.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"

namespace dhelix::rt {
namespace {

std::atomic<MpiWaitMode> g_mode{MpiWaitMode::kBackoff};
std::atomic<int64_t> g_max_sleep_us{kDefaultMaxSleepUs};
thread_local bool g_beside_computation = false;

// Linux lets a thread's timers fire up to its timer slack late (50 us by default) so that
// wake-ups can be merged: a 1 us sleep took 65 us here, idle or not. A waiting thread asks
// for the sleeps it names (slack 1 ns), once per thread; the wake-up itself still costs
// about 15 us on this host (docs/runtime.md).
void use_exact_sleeps() {
  thread_local bool done = false;
  if (done) return;
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // best effort: a failure leaves 50 us slack
  done = true;
}

}  // namespace

const char* mpi_wait_mode_name(MpiWaitMode mode) {
  return mode == MpiWaitMode::kSpin ? "spin" : "backoff";
}

std::optional<MpiWaitMode> parse_mpi_wait_mode(std::string_view name) {
  if (name == "spin") return MpiWaitMode::kSpin;
  if (name == "backoff") return MpiWaitMode::kBackoff;
  return std::nullopt;
}

void set_mpi_wait_mode(MpiWaitMode mode) { g_mode.store(mode, std::memory_order_relaxed); }

MpiWaitMode mpi_wait_mode() { return g_mode.load(std::memory_order_relaxed); }

void set_mpi_max_sleep_us(int64_t us) {
  DHELIX_CHECK(us >= 1);
  g_max_sleep_us.store(us, std::memory_order_relaxed);
}

int64_t mpi_max_sleep_us() { return g_max_sleep_us.load(std::memory_order_relaxed); }

void mark_beside_computation() { g_beside_computation = true; }

bool beside_computation() { return g_beside_computation; }

void wait_for(MPI_Request& request, const char* call) {
  if (request == MPI_REQUEST_NULL) return;
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), call);
    return;
  }
  use_exact_sleeps();
  const int64_t max_sleep_us = mpi_max_sleep_us();
  int64_t sleep_us = 1;
  for (int tests = 0;; ++tests) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    // A thread beside computation never yields; it sleeps (mpi_wait.h).
    if (tests < kYieldTests && !beside_computation()) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(max_sleep_us, 2 * sleep_us);
    }
  }
}

}  // namespace dhelix::rt
