#include "runtime/cuda/device_comms.h"

#include <fmt/format.h>
#include <mpi.h>

#include "lib/error.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cuda/channel_agreement.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda {

rt::CommSlot comm_slot_of(DeviceStream stream) {
  switch (stream) {
    case DeviceStream::kCompute:
      return rt::CommSlot::kMain;
    case DeviceStream::kLocalComm:
      return rt::CommSlot::kLocalComm;
    case DeviceStream::kCrossComm:
      return rt::CommSlot::kCrossComm;
    case DeviceStream::kReceive:
      break;
  }
  throw Error(ErrorCode::kInternal, "the receive stream runs no collectives");
}

DeviceCommDirectory::DeviceCommDirectory(rt::ProcessGroups& groups,
                                         const std::vector<const RankProgram*>& programs,
                                         DeviceCommSetup setup)
    : setup_(std::move(setup)), world_rank_(groups.world_rank()) {
  setup_.options.world_rank = world_rank_;
  // The agreement first: when it refuses the programs, every rank throws here alike, before
  // any NCCL communicator exists.
  ChannelAgreement agreement(programs, world_rank_, setup_.num_layers);
  channels_ = agreement.channels();
  receive_orders_ = agreement.receive_orders();
  create_collectives(groups);
  create_channels(agreement);
  agreement.release_communicators();  // NCCL no longer needs them after its init
  warm_up_channels();
}

DeviceCommDirectory::~DeviceCommDirectory() = default;

void DeviceCommDirectory::create_collectives(rt::ProcessGroups& groups) {
  for (const auto& [dim, stream] : setup_.collectives) {
    const std::string name = parallel_dim_name(dim);
    auto* mpi = dynamic_cast<rt::MpiCommunicator*>(&groups.group(dim, comm_slot_of(stream)));
    DHELIX_CHECK_MSG(mpi != nullptr, "ProcessGroups holds MPI communicators");
    groups_[{dim, stream}] = DeviceCommunicator::create_over_mpi(
        mpi->handle(), fmt::format("{} ({})", name, device_stream_name(stream)), setup_.options);
  }
}

void DeviceCommDirectory::create_channels(const ChannelAgreement& agreement) {
  for (size_t i = 0; i < channels_.size(); ++i) {
    const ChannelPair& pair = channels_[i];
    if (agreement.communicator(i) == MPI_COMM_NULL) continue;
    auto comm = DeviceCommunicator::create_over_mpi(
        agreement.communicator(i), fmt::format("pp {}->{}", pair.sender, pair.receiver),
        setup_.options);
    if (pair.sender == world_rank_) {
      to_[pair.receiver] = std::move(comm);
    } else {
      from_[pair.sender] = std::move(comm);
    }
  }
}

void DeviceCommDirectory::warm_up_channels() {
  if (to_.empty() && from_.empty()) return;
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Release {
    cudaStream_t stream;
    float** buffer;
    ~Release() {
      if (*buffer != nullptr) static_cast<void>(cudaFree(*buffer));
      static_cast<void>(cudaStreamDestroy(stream));
    }
  } release{stream, &buffer};
  DHELIX_CUDA(cudaMalloc(&buffer, sizeof(float)));
  for (const ChannelPair& pair : channels_) {
    if (pair.sender == world_rank_) {
      to_.at(pair.receiver)->send(buffer, 1, DeviceDtype::kFloat32, 1, stream);
    } else if (pair.receiver == world_rank_) {
      from_.at(pair.sender)->recv(buffer, 1, DeviceDtype::kFloat32, 0, stream);
    }
  }
  for (auto* map : {&to_, &from_}) {
    for (auto& [peer, comm] : *map) comm->wait(stream);
  }
}

DeviceCommunicator& DeviceCommDirectory::group(ParallelDim dim, DeviceStream stream) {
  const auto it = groups_.find({dim, stream});
  if (it == groups_.end()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("no NCCL communicator for group {} on the {} stream (the device "
                            "setup created none)",
                            parallel_dim_name(dim), device_stream_name(stream)));
  }
  return *it->second;
}

const ReceiveOrders& DeviceCommDirectory::receive_orders(ExecutionMode mode) const {
  const auto it = receive_orders_.find(mode);
  if (it == receive_orders_.end()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: the device setup was given no {} program", world_rank_,
                            execution_mode_name(mode)));
  }
  return it->second;
}

DeviceCommunicator& DeviceCommDirectory::channel_to(int64_t peer) {
  const auto it = to_.find(peer);
  if (it == to_.end()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: no pipeline channel to rank {}", world_rank_, peer));
  }
  return *it->second;
}

DeviceCommunicator& DeviceCommDirectory::channel_from(int64_t peer) {
  const auto it = from_.find(peer);
  if (it == from_.end()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: no pipeline channel from rank {}", world_rank_, peer));
  }
  return *it->second;
}

std::vector<int64_t> DeviceCommDirectory::receive_peers() const {
  std::vector<int64_t> peers;
  for (const auto& [peer, comm] : from_) peers.push_back(peer);
  return peers;
}

}  // namespace dhelix::cuda
