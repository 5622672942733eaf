#include "runtime/cuda/device_streams.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda {
namespace {

cudaStream_t create_stream(int priority) {
  cudaStream_t stream = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return stream;
}

cudaEvent_t create_event(unsigned flags) {
  cudaEvent_t event = nullptr;
  DHELIX_CUDA(cudaEventCreateWithFlags(&event, flags));
  return event;
}

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

void check_device_max_connections(const std::optional<std::string>& setting, int64_t streams) {
  constexpr int64_t kDefaultQueues = 8;  // CUDA's default
  constexpr int64_t kMostQueues = 32;    // the largest value CUDA accepts
  int64_t queues = kDefaultQueues;
  std::string shown = "CUDA_DEVICE_MAX_CONNECTIONS unset (CUDA's default: 8 queues)";
  if (setting) {
    const char* end = setting->data() + setting->size();
    const auto [at, error] = std::from_chars(setting->data(), end, queues);
    if (error != std::errc() || at != end) queues = -1;
    shown = "CUDA_DEVICE_MAX_CONNECTIONS=" + *setting;
  }
  if (queues >= streams) return;
  const std::string fix =
      streams > kMostQueues
          ? fmt::format("CUDA allows at most {}: this rank receives from too many pipeline peers",
                        kMostQueues)
      : streams <= kDefaultQueues ? "unset it or set it to 8 or more"
                                  : fmt::format("set it to {} or more", streams);
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: dhelix-run uses {} CUDA streams on this rank, which need at least "
                          "{} hardware queues (with fewer, a stream waiting for a peer rank holds "
                          "back the work queued behind it on other streams and the ranks can "
                          "deadlock); {}",
                          shown, streams, streams, fix));
}

DeviceStreams::DeviceStreams(std::vector<int64_t> receive_peers)
    : receive_peers_(std::move(receive_peers)) {
  check_device_max_connections(environment("CUDA_DEVICE_MAX_CONNECTIONS"), num_streams());
  try {
    int least = 0;
    int greatest = 0;
    DHELIX_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      const bool high = device_stream_high_priority(static_cast<DeviceStream>(s));
      streams_[static_cast<size_t>(s)] = create_stream(high ? greatest : least);
    }
    for (size_t i = 0; i < receive_peers_.size(); ++i) {
      channel_streams_.push_back(create_stream(greatest));
    }
    gemm_ = std::make_unique<CublasGemm>(stream(DeviceStream::kCompute));
    start_ = create_event(cudaEventDefault);
    end_ = create_event(cudaEventDefault);
  } catch (...) {
    destroy();
    throw;
  }
}

DeviceStreams::~DeviceStreams() { destroy(); }

void DeviceStreams::destroy() noexcept {
  // The handle goes before its stream; errors are ignored (a destructor must not throw,
  // and after a failure the device may refuse everything).
  gemm_.reset();
  for (cudaEvent_t event : events_) static_cast<void>(cudaEventDestroy(event));
  events_.clear();
  for (cudaEvent_t* event : {&start_, &end_}) {
    if (*event != nullptr) static_cast<void>(cudaEventDestroy(*event));
    *event = nullptr;
  }
  for (cudaStream_t stream : channel_streams_) static_cast<void>(cudaStreamDestroy(stream));
  channel_streams_.clear();
  for (cudaStream_t& stream : streams_) {
    if (stream != nullptr) static_cast<void>(cudaStreamDestroy(stream));
    stream = nullptr;
  }
}

cudaStream_t DeviceStreams::channel_stream(int64_t peer) const {
  const auto it = std::find(receive_peers_.begin(), receive_peers_.end(), peer);
  DHELIX_CHECK_MSG(it != receive_peers_.end(), "no channel stream for this peer");
  return channel_streams_[static_cast<size_t>(it - receive_peers_.begin())];
}

void DeviceStreams::reserve_events(int64_t count) {
  while (static_cast<int64_t>(events_.size()) < count) {
    events_.push_back(create_event(cudaEventDisableTiming));
  }
}

cudaEvent_t DeviceStreams::event(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < static_cast<int64_t>(events_.size()));
  return events_[static_cast<size_t>(index)];
}

}  // namespace dhelix::cuda
