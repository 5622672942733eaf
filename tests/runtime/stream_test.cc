#include "runtime/exec/stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dhelix::rt {
namespace {

TEST(Stream, RunsWorkInEnqueueOrder) {
  auto failure = std::make_shared<FailureState>();
  std::vector<int> order;
  {
    Stream stream("compute", failure);
    for (int i = 0; i < 50; ++i) stream.enqueue([&order, i] { order.push_back(i); }, {}, nullptr);
    stream.drain();
  }
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

// Work on stream B that waits for a completion of stream A starts only after A's work,
// even when A's work is slow and B's queue is reached first.
TEST(Stream, WaitsForCompletionsOfOtherStreams) {
  auto failure = std::make_shared<FailureState>();
  std::mutex mutex;
  std::vector<std::string> log;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    log.push_back(what);
  };
  Completion produced;
  Stream a("compute", failure);
  Stream b("local_comm", failure);
  b.enqueue([&] { note("consumer"); }, {&produced}, nullptr);
  a.enqueue(
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        note("producer");
      },
      {}, &produced);
  a.drain();
  b.drain();
  EXPECT_EQ(log, (std::vector<std::string>{"producer", "consumer"}));
}

// The first failure is kept and handed to the handler once; later work on every stream is
// skipped but its completions are still set, so nothing waits forever.
TEST(Stream, FailureSkipsTheRestAndIsRethrown) {
  std::atomic<int> handled{0};
  auto failure = std::make_shared<FailureState>([&](std::exception_ptr) { ++handled; });
  std::atomic<int> ran{0};
  Completion first_done;
  Completion second_done;
  Stream a("compute", failure);
  Stream b("local_comm", failure);
  a.enqueue([] { throw std::runtime_error("gemm failed"); }, {}, &first_done);
  b.enqueue([&] { ++ran; }, {&first_done}, &second_done);
  a.enqueue([] { throw std::runtime_error("second failure"); }, {&second_done}, nullptr);
  a.drain();
  b.drain();
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(handled.load(), 1);
  EXPECT_TRUE(second_done.is_set());
  try {
    failure->rethrow_if_failed();
    FAIL() << "expected the failure";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "gemm failed");
  }
}

}  // namespace
}  // namespace dhelix::rt
