#include "runtime/cuda/device_session.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::cuda {

DeviceSession::DeviceSession(DeviceApi& api, const DeviceCommSetup& setup,
                             const std::vector<const RankProgram*>& programs,
                             const std::vector<GemmShape>& gemm_shapes,
                             const std::optional<AttentionSetup>& attention,
                             const std::optional<std::string>& max_connections,
                             const CommFactory& make_comms) {
  const CommFootprint footprint = comm_footprint(setup, programs);
  streams_ = std::make_unique<DeviceStreams>(api, footprint.receive_peers, footprint.communicators,
                                             max_connections, setup.reduction_stream);
  preparation_ =
      prepare_device(api, gemm_shapes, attention, streams_->stream(DeviceStream::kCompute));
  comms_ = make_comms(api, setup);
  if (comms_->size() != footprint.communicators ||
      comms_->receive_peers() != footprint.receive_peers) {
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: the set-up made {} NCCL communicators where the programs "
                            "call for {}",
                            comms_->world_rank(), comms_->size(), footprint.communicators));
  }
}

DeviceSession::~DeviceSession() {
  comms_.reset();  // the agreed order (device_comms.h)
  streams_.reset();
}

}  // namespace dhelix::cuda
