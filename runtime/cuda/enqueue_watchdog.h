#pragma once
// The watchdog that runs while the host enqueues an iteration (device_executor.h, step 3).
// Enqueueing is not instant: an NCCL call may block the host (its first use of an
// algorithm connects to the peers; a full work queue waits for room), and a peer that died
// or an NCCL network error then leaves the host stuck inside that call, where the host wait
// at the end (step 4), which polls the communicators, is never reached. So a thread of its
// own polls every communicator the iteration uses (ncclCommGetAsyncError through
// DeviceCommunicator::poll, which is thread-safe against the enqueueing thread):
//   * an asynchronous error aborts every communicator of the iteration (the abort ends an
//     NCCL call blocked on it; the host may be blocked on another one than the failed one)
//     and is kept as the iteration's failure;
//   * enqueueing that takes longer than `timeout_s` (dhelix-run --watchdog-s) aborts every
//     communicator of the iteration (unblocking the stuck call) and fails naming the
//     instruction being enqueued.
// The enqueueing thread calls check() between instructions and failure() when an enqueue
// threw: the watchdog's error, if any, is the cause, the enqueue's own error ("the
// communicator was aborted") only its consequence.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda/nccl_communicator.h"

namespace dhelix::cuda {

class EnqueueWatchdog {
 public:
  /// Starts polling `comms` every `period_s` seconds. `position` describes what the host is
  /// enqueueing now (called on the watchdog's thread, only when it reports a timeout).
  EnqueueWatchdog(std::vector<DeviceCommunicator*> comms, double timeout_s, double period_s,
                  std::function<std::string()> position);
  /// Stops the thread (joins it).
  ~EnqueueWatchdog();
  EnqueueWatchdog(const EnqueueWatchdog&) = delete;
  EnqueueWatchdog& operator=(const EnqueueWatchdog&) = delete;

  /// Rethrows the watchdog's failure, if it found one.
  void check() const;
  /// The watchdog's failure, or nullptr.
  std::exception_ptr failure() const;
  /// Stops polling; check() still reports what was found before.
  void stop();

 private:
  void run();
  void fail(std::exception_ptr error);

  std::vector<DeviceCommunicator*> comms_;
  double timeout_s_;
  double period_s_;
  std::function<std::string()> position_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> failed_{false};
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace dhelix::cuda
