// runtime/exec/prompt_wakeup.h: where the kernel takes the request (Linux 6.12 and later),
// the thread's slice reads back as the requested 0.1 ms and its nice value is unchanged;
// DHELIX_NO_PROMPT_WAKEUPS makes it ask nothing. A communication stream asks, the compute
// stream does not; a thread that asked is beside computation (its MPI waits never yield).

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/comm/mpi_wait.h"
#include "runtime/exec/prompt_wakeup.h"
#include "runtime/exec/stream.h"

namespace dhelix::rt {
namespace {

// The calling thread's requested slice, ns.
int64_t current_slice_ns() { return requested_slice_ns(); }

TEST(PromptWakeup, TheThreadsSliceBecomesTheShortestAndItsNiceStays) {
  std::thread([] {
    ASSERT_EQ(setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 3), 0);
    if (!request_prompt_wakeups()) GTEST_SKIP() << "this kernel takes no slice request";
    EXPECT_EQ(current_slice_ns(), int64_t{kCommSliceUs} * 1000);
    EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))), 3);
  }).join();
}

TEST(PromptWakeup, CommunicationStreamsAskAndTheComputeStreamDoesNot) {
  std::thread([] {
    if (!request_prompt_wakeups()) GTEST_SKIP() << "this kernel takes no slice request";
  }).join();
  auto failure = std::make_shared<FailureState>();
  int64_t comm_slice = -2, compute_slice = -2;
  {
    Stream comm("local_comm", failure, -1, /*prompt_wakeups=*/true);
    Stream compute("compute", failure);
    comm.enqueue([&] { comm_slice = current_slice_ns(); }, {}, nullptr);
    compute.enqueue([&] { compute_slice = current_slice_ns(); }, {}, nullptr);
  }
  EXPECT_EQ(comm_slice, int64_t{kCommSliceUs} * 1000);
  EXPECT_NE(compute_slice, int64_t{kCommSliceUs} * 1000);
}

TEST(PromptWakeup, AThreadThatAskedIsBesideComputationAndStaysSo) {
  // runtime/comm/mpi_wait.h: such a thread waits for MPI without yielding. Per thread.
  std::thread([] {
    EXPECT_FALSE(beside_computation());
    request_prompt_wakeups();
    EXPECT_TRUE(beside_computation());
    std::thread([] { EXPECT_FALSE(beside_computation()); }).join();
  }).join();
  auto failure = std::make_shared<FailureState>();
  bool comm_beside = false, compute_beside = true;
  {
    Stream comm("local_comm", failure, -1, /*prompt_wakeups=*/true);
    Stream compute("compute", failure);
    comm.enqueue([&] { comm_beside = beside_computation(); }, {}, nullptr);
    compute.enqueue([&] { compute_beside = beside_computation(); }, {}, nullptr);
  }
  EXPECT_TRUE(comm_beside);
  EXPECT_FALSE(compute_beside);
}

TEST(PromptWakeup, TheEnvironmentTurnsItOff) {
  setenv("DHELIX_NO_PROMPT_WAKEUPS", "1", 1);
  std::thread([] {
    EXPECT_FALSE(request_prompt_wakeups());
    EXPECT_NE(current_slice_ns(), int64_t{kCommSliceUs} * 1000);
    EXPECT_TRUE(beside_computation());  // it still shares a core: MPI waits never yield
  }).join();
  unsetenv("DHELIX_NO_PROMPT_WAKEUPS");
}

}  // namespace
}  // namespace dhelix::rt
