#include "runtime/cuda/device_streams.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "lib/error.h"

namespace dhelix::cuda {

void check_device_max_connections(const std::optional<std::string>& setting, StreamCount count) {
  constexpr int64_t kDefaultQueues = 8;  // CUDA's default
  constexpr int64_t kMostQueues = 32;    // the largest value CUDA accepts
  const int64_t streams = count.total();
  int64_t queues = kDefaultQueues;
  std::string shown = "CUDA_DEVICE_MAX_CONNECTIONS unset (CUDA's default: 8 queues)";
  if (setting) {
    const char* end = setting->data() + setting->size();
    const auto [at, error] = std::from_chars(setting->data(), end, queues);
    if (error != std::errc() || at != end) queues = -1;
    shown = "CUDA_DEVICE_MAX_CONNECTIONS=" + *setting;
  }
  if (queues >= streams) return;
  // Unset in effect with more than 8 streams: dhelix-run sets 32 before CUDA starts, so
  // CUDA had started before that (cuda_environment.h), and only the job script can help.
  const std::string unset_fix = fmt::format(
      "CUDA started before dhelix-run could set it (a CUDA-aware MPI or a library loaded "
      "before dhelix; see the warning above): export CUDA_DEVICE_MAX_CONNECTIONS={} in the "
      "job script (mpirun -x)",
      kMostQueues);
  const std::string fix =
      streams > kMostQueues
          ? fmt::format(
                "CUDA allows at most {}: this rank uses too many communicators or "
                "pipeline peers",
                kMostQueues)
      : !setting                  ? unset_fix
      : streams <= kDefaultQueues ? "unset it or set it to 8 or more"
                                  : fmt::format(
                                        "unset it (dhelix-run then sets {}) or set it to "
                                        "{} or more",
                                        kMostQueues, streams);
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: dhelix-run uses {} CUDA streams on this rank ({} of its own, {} "
                          "of NCCL's), which need at least {} hardware queues (with fewer, a "
                          "stream waiting for a peer rank holds back the work queued behind it "
                          "on other streams and the ranks can deadlock); {}",
                          shown, streams, count.own, count.library, streams, fix));
}

DeviceStreams::DeviceStreams(DeviceApi& api, std::vector<int64_t> receive_peers,
                             int64_t communicators,
                             const std::optional<std::string>& max_connections, bool reduction)
    : api_(api), receive_peers_(std::move(receive_peers)) {
  count_.own =
      kNumDeviceStreams + static_cast<int64_t>(receive_peers_.size()) + (reduction ? 1 : 0);
  count_.library = communicators * api_.internal_streams_per_comm();
  check_device_max_connections(max_connections, count_);
  try {
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      const bool high = device_stream_high_priority(static_cast<DeviceStream>(s));
      streams_[static_cast<size_t>(s)] = api_.create_stream(high);
    }
    for (size_t i = 0; i < receive_peers_.size(); ++i) {
      channel_streams_.push_back(api_.create_stream(true));
    }
    if (reduction) reduction_ = api_.create_stream(true);
    start_ = api_.create_event(true);
    end_ = api_.create_event(true);
  } catch (...) {
    destroy();
    throw;
  }
}

DeviceStreams::~DeviceStreams() { destroy(); }

void DeviceStreams::destroy() noexcept {
  for (EventHandle event : events_) api_.destroy_event(event);
  events_.clear();
  for (EventHandle* event : {&start_, &end_}) {
    if (*event != nullptr) api_.destroy_event(*event);
    *event = nullptr;
  }
  if (reduction_ != nullptr) api_.destroy_stream(reduction_);
  reduction_ = nullptr;
  for (StreamHandle stream : channel_streams_) api_.destroy_stream(stream);
  channel_streams_.clear();
  for (StreamHandle& stream : streams_) {
    if (stream != nullptr) api_.destroy_stream(stream);
    stream = nullptr;
  }
}

StreamHandle DeviceStreams::channel_stream(int64_t peer) const {
  const auto it = std::find(receive_peers_.begin(), receive_peers_.end(), peer);
  DHELIX_CHECK_MSG(it != receive_peers_.end(), "no channel stream for this peer");
  return channel_streams_[static_cast<size_t>(it - receive_peers_.begin())];
}

void DeviceStreams::reserve_events(int64_t count) {
  while (static_cast<int64_t>(events_.size()) < count) {
    events_.push_back(api_.create_event(false));
  }
}

EventHandle DeviceStreams::event(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < static_cast<int64_t>(events_.size()));
  return events_[static_cast<size_t>(index)];
}

}  // namespace dhelix::cuda
