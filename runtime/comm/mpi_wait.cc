#include "runtime/comm/mpi_wait.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/comm/mpi_environment.h"

namespace dhelix::rt {
namespace {

std::atomic<MpiWaitMode> g_mode{MpiWaitMode::kBackoff};

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

void wait_for(MPI_Request& request, const char* call) {
  if (request == MPI_REQUEST_NULL) return;
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), call);
    return;
  }
  int64_t sleep_us = 1;
  for (int tests = 0;; ++tests) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    if (tests < kYieldTests) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(kMaxSleepUs, 2 * sleep_us);
    }
  }
}

}  // namespace dhelix::rt
