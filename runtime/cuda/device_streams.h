#pragma once
// The CUDA streams and events one rank runs its program on (runtime/cuda/stream_lowering.h):
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
//   * one CublasGemm bound to the compute stream: compute ops run only there (sequential
//     mode runs everything there);
//   * a pool of synchronisation events (cudaEventDisableTiming), grown at setup time only,
//     and two timing events for the wall time of an iteration.
// Everything is created on the current CUDA device. The destructor never throws.
//
// Hardware queues. The streams are multiplexed onto CUDA_DEVICE_MAX_CONNECTIONS hardware
// queues. With fewer queues than streams, work of two streams shares a queue in enqueue
// order, and a queue whose head waits (an event wait, a receive waiting for its peer) holds
// back everything behind it, including work a peer rank needs: the executor could
// deadlock across ranks. The constructor therefore refuses a setting below the number of
// streams this rank uses.

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/stream_lowering.h"

namespace dhelix::cuda {

/// Throws Error(kInvalidInput) when `setting` (the value of CUDA_DEVICE_MAX_CONNECTIONS;
/// nullopt when unset, which means CUDA's default of 8) is a number below `streams`, or
/// not a number:
/// "CUDA_DEVICE_MAX_CONNECTIONS=1: dhelix-run uses 5 CUDA streams on this rank, which
/// need at least 5 hardware queues (...)".
void check_device_max_connections(const std::optional<std::string>& setting, int64_t streams);

class DeviceStreams {
 public:
  /// Creates the streams (one channel stream per rank of `receive_peers`, world ranks),
  /// the compute stream's CublasGemm and the timing events. Checks
  /// CUDA_DEVICE_MAX_CONNECTIONS from the environment (check_device_max_connections).
  explicit DeviceStreams(std::vector<int64_t> receive_peers);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  cudaStream_t stream(DeviceStream which) const { return streams_[static_cast<size_t>(which)]; }
  /// The stream that receives from world rank `peer`; DHELIX_CHECKs it was asked for.
  cudaStream_t channel_stream(int64_t peer) const;
  const std::vector<int64_t>& receive_peers() const { return receive_peers_; }
  /// The GEMM handle of the compute stream.
  CublasGemm& compute_gemm() const { return *gemm_; }
  /// Streams this rank uses: the four plus one per receive peer.
  int64_t num_streams() const {
    return kNumDeviceStreams + static_cast<int64_t>(receive_peers_.size());
  }

  /// Makes at least `count` synchronisation events exist (call before an iteration:
  /// creating events is not free). Events are reused by later iterations.
  void reserve_events(int64_t count);
  /// Event `index` < the count reserved.
  cudaEvent_t event(int64_t index) const;
  /// Timing events (timing enabled) around an iteration on the compute stream.
  cudaEvent_t start_event() const { return start_; }
  cudaEvent_t end_event() const { return end_; }

 private:
  void destroy() noexcept;

  std::vector<int64_t> receive_peers_;
  std::array<cudaStream_t, kNumDeviceStreams> streams_{};
  std::vector<cudaStream_t> channel_streams_;  // parallel to receive_peers_
  std::unique_ptr<CublasGemm> gemm_;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

}  // namespace dhelix::cuda
