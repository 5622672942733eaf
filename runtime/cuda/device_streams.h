#pragma once
// The CUDA streams and events one rank runs its program on (runtime/exec/stream_lowering.h):
//   * the four streams of DeviceStream: compute at the device's least (default) priority,
//     local_comm, cross_comm and receive at its greatest, all cudaStreamNonBlocking so that
//     nothing orders them with the legacy default stream;
//   * one channel stream per rank this rank receives pipeline messages from, also at the
//     greatest priority. The executor posts every receive of an iteration on these before
//     anything else (as the CPU interpreter posts its MPI receives), so that a sender's
//     NCCL send never waits for the receiver to reach a point of its program: it waits at
//     most for the receives of the same channel before it, whose sends it has already
//     made. The receive stream then only waits on the channel streams' events, in program
//     order (device_executor.h);
//   * with reduction, one stream for the data-parallel gradient reduction
//     (device_gradient_reducer.h), at the greatest priority: its collectives are on the
//     critical path of the step as the other communication streams' are;
//   * a pool of synchronisation events (cudaEventDisableTiming), grown at setup time only,
//     and two timing events for the wall time of an iteration.
// Everything is created through DeviceApi on the current device. The destructor never throws.
//
// Hardware queues. Every stream of the process, NCCL's own included, is multiplexed onto
// CUDA_DEVICE_MAX_CONNECTIONS hardware queues (CUDA Programming Guide, "Streams" and the
// environment-variable appendix). With fewer queues than streams, work of two streams
// shares a queue in enqueue order, and a queue whose head waits (an event wait, a receive
// waiting for its peer) holds back everything behind it, including work a peer rank needs:
// the executor could deadlock across ranks. NCCL keeps streams of its own per communicator
// (DeviceApi::internal_streams_per_comm), so the constructor counts dhelix's streams plus
// those, and refuses a setting below the sum. dhelix-run raises the setting itself before
// CUDA starts when the user left it unset (runtime/cuda/device_setup.h), so the check
// refuses only a value the user set too low.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/device_api.h"
#include "runtime/exec/stream_lowering.h"

namespace dhelix::cuda {

/// The streams one rank's process keeps busy at once.
struct StreamCount {
  int64_t own = 0;      ///< dhelix's: the four of DeviceStream, one per receive peer, the
                        ///< reduction stream
  int64_t library = 0;  ///< NCCL's: internal streams per communicator x communicators
  int64_t total() const { return own + library; }
};

/// Throws Error(kInvalidInput) when `setting` (the value of CUDA_DEVICE_MAX_CONNECTIONS;
/// nullopt when unset, which means CUDA's default of 8) is a number below count.total(), or
/// not a number:
/// "CUDA_DEVICE_MAX_CONNECTIONS=8: dhelix-run uses 18 CUDA streams on this rank (6 of its
/// own, 12 of NCCL's for 6 communicators), which need at least 18 hardware queues (...)".
void check_device_max_connections(const std::optional<std::string>& setting, StreamCount count);

class DeviceStreams {
 public:
  /// Creates the streams (one channel stream per rank of `receive_peers`, world ranks) and
  /// the timing events. Checks CUDA_DEVICE_MAX_CONNECTIONS (`max_connections`, the
  /// environment's value) against these streams plus the internal streams of
  /// `communicators` NCCL communicators (check_device_max_connections).
  DeviceStreams(DeviceApi& api, std::vector<int64_t> receive_peers, int64_t communicators,
                const std::optional<std::string>& max_connections, bool reduction = false);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  StreamHandle stream(DeviceStream which) const { return streams_[static_cast<size_t>(which)]; }
  /// The stream that receives from world rank `peer`; DHELIX_CHECKs it was asked for.
  StreamHandle channel_stream(int64_t peer) const;
  const std::vector<int64_t>& receive_peers() const { return receive_peers_; }
  /// The gradient reduction's stream; null when not asked for.
  StreamHandle reduction_stream() const { return reduction_; }
  /// Streams this rank's process uses (own and NCCL's).
  StreamCount count() const { return count_; }

  /// Makes at least `count` synchronisation events exist (call before an iteration:
  /// creating events is not free). Events are reused by later iterations.
  void reserve_events(int64_t count);
  /// Event `index` < the count reserved.
  EventHandle event(int64_t index) const;
  /// Timing events (timing enabled) around an iteration on the compute stream.
  EventHandle start_event() const { return start_; }
  EventHandle end_event() const { return end_; }

 private:
  void destroy() noexcept;

  DeviceApi& api_;
  std::vector<int64_t> receive_peers_;
  StreamCount count_;
  std::array<StreamHandle, kNumDeviceStreams> streams_{};
  std::vector<StreamHandle> channel_streams_;  // parallel to receive_peers_
  StreamHandle reduction_ = nullptr;
  std::vector<EventHandle> events_;
  EventHandle start_ = nullptr;
  EventHandle end_ = nullptr;
};

}  // namespace dhelix::cuda
