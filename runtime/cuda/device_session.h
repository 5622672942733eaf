#pragma once
// Everything one rank holds on its GPU from set-up to teardown, made in the order of
// device_setup.h so that nothing of iteration 1 can hang behind a posted receive:
//   1. the streams, counted with NCCL's internal ones against CUDA_DEVICE_MAX_CONNECTIONS
//      (device_streams.h), from the communicators this rank's programs need
//      (comm_footprint);
//   2. the device prepared: every kernel loaded, the stack limit set, each GEMM shape run
//      once on the compute stream, the attention path decided (prepare_device);
//   3. the communicators created and each warmed (device_comms.h), in the agreed order.
// The destructor destroys the communicators in their agreed order, then the streams.
// The CUDA engine (cuda_engine.cc) and the fake-device tests (tests/device/) both build
// their rank's device state through this one class.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_setup.h"
#include "runtime/cuda/device_streams.h"

namespace dhelix::cuda {

class DeviceSession {
 public:
  /// Makes the rank's DeviceCommDirectory (DeviceCommDirectory::over_mpi on a cluster; a
  /// plan every simulated rank computes alike in the tests).
  using CommFactory =
      std::function<std::unique_ptr<DeviceCommDirectory>(DeviceApi&, const DeviceCommSetup&)>;

  /// Steps 1-3 of the file comment. `max_connections`: CUDA_DEVICE_MAX_CONNECTIONS as the
  /// process sees it. Throws Error(kInternal) when the factory made other communicators than
  /// the programs call for.
  DeviceSession(DeviceApi& api, const DeviceCommSetup& setup,
                const std::vector<const RankProgram*>& programs,
                const std::vector<GemmShape>& gemm_shapes,
                const std::optional<AttentionSetup>& attention,
                const std::optional<std::string>& max_connections, const CommFactory& make_comms);
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  DeviceStreams& streams() { return *streams_; }
  DeviceCommDirectory& comms() { return *comms_; }
  const DevicePreparation& preparation() const { return preparation_; }

 private:
  std::unique_ptr<DeviceStreams> streams_;
  DevicePreparation preparation_;
  std::unique_ptr<DeviceCommDirectory> comms_;
};

}  // namespace dhelix::cuda
