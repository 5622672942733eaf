// The hang reports of the CUDA executor (runtime/cuda/device_executor.h, steps 3 and 4; the
// enqueue watchdog, runtime/cuda/enqueue_watchdog.h), on the recording device's faults:
//   * a stream that never finishes: the error names it, where it is (between the last of
//     its instructions whose event fired and the first whose event did not), the last
//     instruction enqueued on it and its communicators with their last operation, within
//     the watchdog's time;
//   * an asynchronous NCCL error while the host is blocked inside an NCCL send (a dead
//     peer): the watchdog reports the error and aborts every communicator, which returns
//     the host, instead of the host staying blocked;
//   * enqueueing stuck past the watchdog's time: the error names the instruction.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;
using Clock = std::chrono::steady_clock;

class HangWatchdog : public ::testing::Test {
 protected:
  HangWatchdog()
      : plan_(read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json")),
        job_(job_from_plan(plan_, "tiny-tp2-pp2")) {}

  // The error of a co-executed run whose rank 0 gets `fault` before its first iteration.
  std::string failure(const BeforeExecute& fault) {
    try {
      simulate_run(plan_, job_, ExecutionMode::kCoExecuted, 1, "32", std::nullopt,
                   [&](int64_t rank, RecordingDevice& device, DeviceStreams& streams,
                       DeviceCommDirectory& comms, DeviceExecutionOptions& options) {
                     if (rank == 0) fault(rank, device, streams, comms, options);
                   });
    } catch (const Error& error) {
      return error.what();
    }
    ADD_FAILURE() << "the run did not fail";
    return "";
  }

  Plan plan_;
  JobSpec job_;
};

TEST_F(HangWatchdog, StuckStreamIsNamedWithItsLastInstructionAndCommunicators) {
  const Clock::time_point start = Clock::now();
  const std::string error = failure([](int64_t, RecordingDevice& device, DeviceStreams& streams,
                                       DeviceCommDirectory&, DeviceExecutionOptions& options) {
    options.timeout_s = 0.2;
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      device.stick_stream(RecordingDevice::id(streams.stream(static_cast<DeviceStream>(s))));
    }
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  EXPECT_NE(error.find("rank 0: the iteration did not finish within 0.2 s (--watchdog-s)"),
            std::string::npos)
      << error;
  // Only the stuck streams are busy; the report says what each was last given and which
  // NCCL communicators it used (the TP collectives' stream: tp, last op all_gather or
  // reduce_scatter).
  // Every stream is stuck from the iteration's start: each is on or before its first
  // instruction that records an event.
  EXPECT_NE(error.find("streams still busy: compute (on or before: rank 0 stage 0 task "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("last instruction enqueued: "), std::string::npos) << error;
  EXPECT_EQ(error.find("after: "), std::string::npos) << error;
  EXPECT_NE(error.find("local_comm (on or before: "), std::string::npos) << error;
  EXPECT_NE(error.find("; NCCL tp"), std::string::npos) << error;
  EXPECT_NE(error.find("(last op "), std::string::npos) << error;
  EXPECT_EQ(error.find("; receive from rank"), std::string::npos) << error;
}

TEST_F(HangWatchdog, AStreamStuckMidwayIsPlacedBetweenTwoInstructions) {
  const std::string error = failure([](int64_t, RecordingDevice& device, DeviceStreams& streams,
                                       DeviceCommDirectory&, DeviceExecutionOptions& options) {
    options.timeout_s = 0.2;
    // The compute stream finishes the work of its first two recorded events (the
    // iteration's start and one instruction), then sticks.
    device.stick_stream(RecordingDevice::id(streams.stream(DeviceStream::kCompute)), 2);
  });
  const size_t compute = error.find("streams still busy: compute (on or before: ");
  ASSERT_NE(compute, std::string::npos) << error;
  const size_t after = error.find("; after: rank 0 stage 0 task ", compute);
  EXPECT_NE(after, std::string::npos) << error;
  EXPECT_LT(after, error.find("last instruction enqueued: ", compute)) << error;
  EXPECT_EQ(error.find("local_comm ("), std::string::npos) << error;  // not stuck
}

TEST_F(HangWatchdog, AsyncErrorWhileTheHostIsBlockedInASendIsReported) {
  const Clock::time_point start = Clock::now();
  const std::string error = failure([&](int64_t, RecordingDevice& device, DeviceStreams&,
                                        DeviceCommDirectory&, DeviceExecutionOptions& options) {
    options.timeout_s = 60;  // the error, not the timeout, must end it
    // A TP communicator fails (a peer died); the host is meanwhile blocked in its first
    // pipeline send, on another communicator, until something aborts that one.
    int64_t failed = 0;
    for (const DeviceCall& call : device.calls()) {
      if (call.kind == Kind::kCommInit && call.label.starts_with("tp")) {
        device.fail_comm(call.comm,
                         "ncclRemoteError: remote process exited or there was a network error");
        ++failed;
      }
    }
    ASSERT_GT(failed, 0);
    device.block_sends(8.0);
  });
  const double took_s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(error.find("ncclRemoteError: remote process exited"), std::string::npos) << error;
  EXPECT_NE(error.find("while enqueueing the iteration"), std::string::npos) << error;
  // Without the watchdog the send stays blocked until the fake gives up.
  EXPECT_EQ(error.find("send blocked"), std::string::npos) << error;
  EXPECT_LT(took_s, 8.0);
}

TEST_F(HangWatchdog, EnqueueingPastTheTimeoutNamesTheInstruction) {
  const std::string error = failure([](int64_t, RecordingDevice& device, DeviceStreams&,
                                       DeviceCommDirectory&, DeviceExecutionOptions& options) {
    options.timeout_s = 0.3;
    device.block_sends(8.0);
  });
  EXPECT_NE(error.find("enqueueing the iteration did not finish within 0.3 s (--watchdog-s); "
                       "the host was enqueueing "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("p2p.activation"), std::string::npos) << error;
  EXPECT_NE(error.find("every NCCL communicator of the iteration was aborted"), std::string::npos)
      << error;
  EXPECT_EQ(error.find("send blocked"), std::string::npos) << error;
}

}  // namespace
}  // namespace dhelix::cuda::testing
