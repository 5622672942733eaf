#pragma once
// Streams and completions on the CPU, with CUDA's semantics: a stream runs its work in the
// order it was enqueued, on a thread of its own; a piece of work may first wait for
// completions recorded by other streams (cudaStreamWaitEvent); nothing waits on the host
// between pieces of work. A rank runs three streams (compute, local communication, cross
// communication), so a collective on a communication stream really runs beside a GEMM on
// the compute stream.
//
// Measurement: enqueue may name a place for the time the stream reached a piece of work,
// before its waits (a steady_clock reading in nanoseconds), so a trace can show the
// cross-stream waits (dhelix-run --trace).
//
// Failure: the first exception any piece of work throws is kept; from then on every stream
// of the same Executor skips its remaining work (but still records its completions, so
// that no stream waits forever) and drain() rethrows that first exception.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dhelix::rt {

/// Set once, when a piece of work has finished (or was skipped after a failure).
class Completion {
 public:
  void set();
  void wait() const;
  bool is_set() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool done_ = false;
};

/// Called once, on the failing stream's thread, with the first failure: a rank whose peers
/// may be blocked in a collective that will never complete ends the job from there
/// (drain() could otherwise wait forever for a stream stuck in such a collective).
using FailureHandler = std::function<void(std::exception_ptr)>;

/// The first failure of a group of streams.
class FailureState {
 public:
  explicit FailureState(FailureHandler handler = {}) : handler_(std::move(handler)) {}
  /// Keeps `error` if it is the first (and calls the handler); later ones are dropped.
  void record(std::exception_ptr error);
  bool failed() const;
  /// Rethrows the first failure, if any.
  void rethrow_if_failed() const;

 private:
  FailureHandler handler_;
  mutable std::mutex mutex_;
  std::exception_ptr first_;
  bool failed_ = false;
};

class Stream {
 public:
  /// Starts the stream's thread. `failure` is shared by the streams of one executor. `cpu`
  /// >= 0 pins the thread to that CPU (runtime/exec/affinity.h); a refusal fails the first
  /// piece of work. `prompt_wakeups`: the thread asks for a short time slice
  /// (runtime/exec/prompt_wakeup.h), as communication streams do.
  Stream(std::string name, std::shared_ptr<FailureState> failure, int cpu = -1,
         bool prompt_wakeups = false);
  /// Finishes the enqueued work (as drain()) without rethrowing, then joins the thread.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// Runs `work` after every completion in `waits` is set, then sets `done` (may be null).
  /// Completions must outlive the work that waits for them. `ready_ns` (may be null)
  /// receives the steady_clock time, in ns, at which the stream reached the work.
  void enqueue(std::function<void()> work, std::vector<const Completion*> waits, Completion* done,
               int64_t* ready_ns = nullptr);
  /// Blocks until every enqueued piece of work has run or been skipped.
  void drain();
  const std::string& name() const { return name_; }

 private:
  struct Item {
    std::function<void()> work;
    std::vector<const Completion*> waits;
    Completion* done = nullptr;
    int64_t* ready_ns = nullptr;
  };
  void run();

  std::string name_;
  std::shared_ptr<FailureState> failure_;
  int cpu_ = -1;
  bool prompt_wakeups_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  int64_t pending_ = 0;  // enqueued and not yet finished
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dhelix::rt
