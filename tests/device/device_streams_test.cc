#include "runtime/cuda/device_streams.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "tests/device/recording_device.h"

namespace dhelix::cuda {
namespace {

using testing::DeviceCall;
using testing::RecordingDevice;

std::string refusal(const std::optional<std::string>& setting, int64_t own, int64_t library = 0) {
  try {
    check_device_max_connections(setting, {.own = own, .library = library});
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  return "";
}

TEST(DeviceStreams, MaxConnectionsBelowTheStreamCountIsRefused) {
  EXPECT_EQ(refusal(std::nullopt, 6), "");
  EXPECT_EQ(refusal("8", 6), "");
  EXPECT_EQ(refusal("6", 6), "");
  EXPECT_EQ(refusal("1", 5),
            "CUDA_DEVICE_MAX_CONNECTIONS=1: dhelix-run uses 5 CUDA streams on this rank (5 of "
            "its own, 0 of NCCL's), which need at least 5 hardware queues (with fewer, a stream "
            "waiting for a peer rank holds back the work queued behind it on other streams and "
            "the ranks can deadlock); unset it or set it to 8 or more");
  EXPECT_EQ(refusal("12", 5, 8),
            "CUDA_DEVICE_MAX_CONNECTIONS=12: dhelix-run uses 13 CUDA streams on this rank (5 of "
            "its own, 8 of NCCL's), which need at least 13 hardware queues (with fewer, a stream "
            "waiting for a peer rank holds back the work queued behind it on other streams and "
            "the ranks can deadlock); unset it (dhelix-run then sets 32) or set it to 13 or more");
  // Unset means CUDA's 8 queues: enough for 8 streams, not for 9; NCCL's count.
  EXPECT_EQ(refusal(std::nullopt, 6, 2), "");
  EXPECT_NE(refusal(std::nullopt, 6, 4).find("uses 10 CUDA streams"), std::string::npos);
  // Unset in effect with more than 8 streams: dhelix-run's own 32 came too late, and the
  // advice is the job script's export, not "unset it".
  EXPECT_NE(refusal(std::nullopt, 6, 4)
                .find("export CUDA_DEVICE_MAX_CONNECTIONS=32 in the job "
                      "script"),
            std::string::npos);
  EXPECT_NE(refusal("32", 5, 28).find("CUDA allows at most 32"), std::string::npos);
  EXPECT_NE(refusal("8 ", 4), "");  // not a number
  EXPECT_NE(refusal("", 4), "");    // set but empty
  EXPECT_NE(refusal("-3", 4), "");
}

TEST(DeviceStreams, PrioritiesEventsAndTeardownOnTheFake) {
  RecordingDevice device;
  {
    DeviceStreams streams(device, {3, 5}, 4, "32");
    EXPECT_EQ(streams.count().own, 6);
    EXPECT_EQ(streams.count().library, 8);  // 2 per communicator
    EXPECT_NE(streams.channel_stream(3), streams.channel_stream(5));
    streams.reserve_events(3);
    streams.reserve_events(2);  // never shrinks, never recreates
    EXPECT_NE(streams.event(0), streams.event(2));
  }
  std::vector<int64_t> high;
  int64_t created_events = 0, destroyed_streams = 0, destroyed_events = 0;
  for (const DeviceCall& call : device.calls()) {
    if (call.kind == DeviceCall::Kind::kCreateStream) high.push_back(call.value);
    created_events += call.kind == DeviceCall::Kind::kCreateEvent;
    destroyed_streams += call.kind == DeviceCall::Kind::kDestroyStream;
    destroyed_events += call.kind == DeviceCall::Kind::kDestroyEvent;
  }
  // compute at the least priority; local_comm, cross_comm, receive and both channels high.
  EXPECT_EQ(high, (std::vector<int64_t>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(created_events, 5);  // 2 timing + 3 reserved
  EXPECT_EQ(destroyed_streams, 6);
  EXPECT_EQ(destroyed_events, 5);
}

TEST(DeviceStreams, RefusedConnectionsCreateNothing) {
  RecordingDevice device;
  EXPECT_THROW(DeviceStreams(device, {1}, 3, "8"), Error);  // 5 + 6 > 8
  EXPECT_TRUE(device.calls().empty());
}

}  // namespace
}  // namespace dhelix::cuda
