#include "runtime/cuda/device_streams.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

std::string refusal(const std::optional<std::string>& setting, int64_t streams) {
  try {
    check_device_max_connections(setting, streams);
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
            "CUDA_DEVICE_MAX_CONNECTIONS=1: dhelix-run uses 5 CUDA streams on this rank, which "
            "need at least 5 hardware queues (with fewer, a stream waiting for a peer rank holds "
            "back the work queued behind it on other streams and the ranks can deadlock); unset "
            "it or set it to 8 or more");
  EXPECT_EQ(refusal("12", 13),
            "CUDA_DEVICE_MAX_CONNECTIONS=12: dhelix-run uses 13 CUDA streams on this rank, which "
            "need at least 13 hardware queues (with fewer, a stream waiting for a peer rank "
            "holds back the work queued behind it on other streams and the ranks can deadlock); "
            "set it to 13 or more");
  // Unset means CUDA's 8 queues: enough for 8 streams, not for 9.
  EXPECT_EQ(refusal(std::nullopt, 8), "");
  EXPECT_EQ(refusal(std::nullopt, 9).substr(0, 100),
            "CUDA_DEVICE_MAX_CONNECTIONS unset (CUDA's default: 8 queues): dhelix-run uses 9 CUDA "
            "streams on this");
  EXPECT_NE(refusal(std::nullopt, 9).find("; set it to 9 or more"), std::string::npos);
  EXPECT_NE(refusal("32", 33).find("CUDA allows at most 32"), std::string::npos);
  EXPECT_NE(refusal("8 ", 4), "");  // not a number
  EXPECT_NE(refusal("", 4), "");    // set but empty
  EXPECT_NE(refusal("-3", 4), "");
}

int priority_of(cudaStream_t stream) {
  int priority = 0;
  DHELIX_CUDA(cudaStreamGetPriority(stream, &priority));
  return priority;
}

unsigned flags_of(cudaStream_t stream) {
  unsigned flags = 0;
  DHELIX_CUDA(cudaStreamGetFlags(stream, &flags));
  return flags;
}

TEST(DeviceStreams, PrioritiesFlagsAndEvents) {
  DHELIX_REQUIRE_GPUS(1);
  int least = 0;
  int greatest = 0;
  DHELIX_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  DeviceStreams streams({3, 5});
  EXPECT_EQ(streams.num_streams(), 6);
  EXPECT_EQ(priority_of(streams.stream(DeviceStream::kCompute)), least);
  for (DeviceStream s :
       {DeviceStream::kLocalComm, DeviceStream::kCrossComm, DeviceStream::kReceive}) {
    EXPECT_EQ(priority_of(streams.stream(s)), greatest) << device_stream_name(s);
    EXPECT_EQ(flags_of(streams.stream(s)), unsigned{cudaStreamNonBlocking});
  }
  EXPECT_EQ(priority_of(streams.channel_stream(5)), greatest);
  EXPECT_NE(streams.channel_stream(3), streams.channel_stream(5));
  EXPECT_EQ(streams.compute_gemm().stream(), streams.stream(DeviceStream::kCompute));
  streams.reserve_events(3);
  // An event recorded on one stream and waited on by another orders them.
  DHELIX_CUDA(cudaEventRecord(streams.event(2), streams.stream(DeviceStream::kCompute)));
  DHELIX_CUDA(cudaStreamWaitEvent(streams.stream(DeviceStream::kReceive), streams.event(2), 0));
  DHELIX_CUDA(cudaStreamSynchronize(streams.stream(DeviceStream::kReceive)));
  EXPECT_EQ(cudaEventQuery(streams.event(2)), cudaSuccess);
}

}  // namespace
}  // namespace dhelix::cuda
