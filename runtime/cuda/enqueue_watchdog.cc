#include "runtime/cuda/enqueue_watchdog.h"

#include <fmt/format.h>

#include <chrono>
#include <utility>

#include "lib/error.h"

namespace dhelix::cuda {

EnqueueWatchdog::EnqueueWatchdog(std::vector<DeviceCommunicator*> comms, double timeout_s,
                                 double period_s, std::function<std::string()> position)
    : comms_(std::move(comms)),
      timeout_s_(timeout_s),
      period_s_(period_s),
      position_(std::move(position)) {
  // Without a communicator nothing can fail asynchronously or block on a peer.
  if (!comms_.empty()) thread_ = std::thread([this] { run(); });
}

EnqueueWatchdog::~EnqueueWatchdog() { stop(); }

void EnqueueWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EnqueueWatchdog::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_ == nullptr) failure_ = std::move(error);
  failed_.store(true);
}

std::exception_ptr EnqueueWatchdog::failure() const {
  if (!failed_.load()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void EnqueueWatchdog::check() const {
  if (std::exception_ptr error = failure()) std::rethrow_exception(error);
}

void EnqueueWatchdog::run() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point since = Clock::now();
  const auto period = std::chrono::duration<double>(period_s_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      for (DeviceCommunicator* comm : comms_) comm->poll();  // aborts and throws on an error
    } catch (...) {
      // The iteration is lost; the host may be blocked on another communicator (a send to
      // a healthy peer that waits for the failed one): abort them all.
      for (DeviceCommunicator* comm : comms_) comm->abort();
      fail(std::current_exception());
      return;
    }
    if (std::chrono::duration<double>(Clock::now() - since).count() > timeout_s_) {
      // The host is stuck inside a call: abort every communicator to get it back.
      for (DeviceCommunicator* comm : comms_) comm->abort();
      fail(std::make_exception_ptr(
          Error(ErrorCode::kInternal,
                fmt::format("enqueueing the iteration did not finish within {} s (--watchdog-s); "
                            "the host was enqueueing {}; every NCCL communicator of the iteration "
                            "was aborted",
                            timeout_s_, position_()))));
      return;
    }
    lock.lock();
    wake_.wait_for(lock, period, [this] { return stopping_; });
  }
}

}  // namespace dhelix::cuda
