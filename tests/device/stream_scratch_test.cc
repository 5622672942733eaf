// runtime/cuda/stream_scratch.h on the recording device: the set-up's scratch (GEMM
// warm-ups, the attention self-check) is zeroed on the stream that uses it, never on the
// legacy default stream, which the rank's non-blocking streams do not wait for.
#include "runtime/cuda/stream_scratch.h"

#include <gtest/gtest.h>

#include <vector>

#include "lib/error.h"
#include "tests/device/recording_device.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

std::vector<Kind> kinds(const RecordingDevice& device) {
  std::vector<Kind> out;
  for (const DeviceCall& call : device.calls()) out.push_back(call.kind);
  return out;
}

TEST(StreamScratch, IsZeroedOnTheStreamThatUsesIt) {
  RecordingDevice device;
  const StreamHandle stream = device.create_stream(/*high_priority=*/false);
  {
    StreamScratch scratch(device, 4096, stream);
    EXPECT_EQ(scratch.bytes(), 4096);
    const DeviceCall& zero = device.calls().back();
    ASSERT_EQ(zero.kind, Kind::kZero);
    EXPECT_EQ(zero.stream, RecordingDevice::id(stream));
    EXPECT_NE(zero.stream, 0);  // 0: the legacy stream
    EXPECT_EQ(zero.count, 4096);
    EXPECT_EQ(zero.address, RecordingDevice::id(scratch.as<void>()));
  }
  EXPECT_EQ(kinds(device),
            (std::vector<Kind>{Kind::kCreateStream, Kind::kAllocate, Kind::kZero, Kind::kFree}));
}

TEST(StreamScratch, AnEmptyBufferIsOneByte) {
  RecordingDevice device;
  const StreamHandle stream = device.create_stream(false);
  StreamScratch scratch(device, 0, stream);
  EXPECT_EQ(scratch.bytes(), 1);
  EXPECT_EQ(device.calls().back().count, 1);
}

TEST(StreamScratch, TheLegacyStreamIsRefusedBeforeAnyAllocation) {
  RecordingDevice device;
  try {
    StreamScratch scratch(device, 64, nullptr);
    FAIL() << "the legacy stream was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(error.what()).find("legacy default stream"), std::string::npos);
  }
  EXPECT_TRUE(device.calls().empty());
}

}  // namespace
}  // namespace dhelix::cuda::testing
