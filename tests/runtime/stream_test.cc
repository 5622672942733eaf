#include "runtime/exec/stream.h"

#include <sched.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lib/error.h"
#include "runtime/exec/affinity.h"

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

// --pin-compute: a stream made with a CPU runs its work there and records when it reached
// the work; ScopedPin pins the calling thread and restores its mask.
TEST(Stream, PinnedStreamRunsOnItsCpuAndReportsWhereItWas) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  auto failure = std::make_shared<FailureState>();
  std::atomic<int> ran_on{-1};
  {
    Stream stream("compute", failure, cpu);
    Completion done;
    int64_t ready_ns = 0;
    stream.enqueue([&] { ran_on = sched_getcpu(); }, {}, &done, &ready_ns);
    stream.drain();
    EXPECT_GT(ready_ns, 0);
  }
  EXPECT_FALSE(failure->failed());
  EXPECT_EQ(ran_on.load(), cpu);

  cpu_set_t before, inside, after;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  {
    const ScopedPin pin(cpu);
    ASSERT_EQ(sched_getaffinity(0, sizeof(inside), &inside), 0);
    EXPECT_EQ(CPU_COUNT(&inside), 1);
    EXPECT_TRUE(CPU_ISSET(cpu, &inside));
  }
  ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&before, &after));
}

TEST(Stream, PinningToACpuOutsideTheSetFailsTheFirstWork) {
  auto failure = std::make_shared<FailureState>();
  bool ran = false;
  {
    Stream stream("compute", failure, CPU_SETSIZE - 1);
    stream.enqueue([&] { ran = true; }, {}, nullptr);
    stream.drain();
  }
  EXPECT_TRUE(failure->failed());
  EXPECT_FALSE(ran);
  EXPECT_THROW(pin_current_thread(CPU_SETSIZE), Error);
}

}  // namespace
}  // namespace dhelix::rt
