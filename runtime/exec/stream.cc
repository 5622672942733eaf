#include "runtime/exec/stream.h"

#include <chrono>
#include <cstdlib>
#include <utility>

#include "runtime/exec/affinity.h"
#include "runtime/exec/prompt_wakeup.h"

namespace dhelix::rt {

void Completion::set() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  changed_.notify_all();
}

void Completion::wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return done_; });
}

bool Completion::is_set() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void FailureState::record(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    failed_ = true;
    first_ = error;
  }
  if (handler_) handler_(error);
}

bool FailureState::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void FailureState::rethrow_if_failed() const {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = first_;
  }
  if (error) std::rethrow_exception(error);
}

Stream::Stream(std::string name, std::shared_ptr<FailureState> failure, int cpu,
               bool prompt_wakeups)
    : name_(std::move(name)),
      failure_(std::move(failure)),
      cpu_(cpu),
      prompt_wakeups_(prompt_wakeups),
      thread_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return pending_ == 0; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Stream::enqueue(std::function<void()> work, std::vector<const Completion*> waits,
                     Completion* done, int64_t* ready_ns) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(work), std::move(waits), done, ready_ns});
    ++pending_;
  }
  changed_.notify_all();
}

void Stream::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return pending_ == 0; });
}

void Stream::run() {
  try {
    pin_current_thread(cpu_);
  } catch (...) {
    failure_->record(std::current_exception());
  }
  if (prompt_wakeups_) request_prompt_wakeups();
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (item.ready_ns != nullptr) {
      *item.ready_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
    }
    for (const Completion* wait : item.waits) wait->wait();
    if (!failure_->failed()) {
      try {
        item.work();
      } catch (...) {
        failure_->record(std::current_exception());
      }
    }
    if (item.done != nullptr) item.done->set();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --pending_;
    }
    changed_.notify_all();
  }
}

}  // namespace dhelix::rt
