#pragma once
// Every NCCL communicator one rank's CUDA executor uses (runtime/cuda/device_executor.h):
//   * collectives: one DeviceCommunicator per (parallel dimension, stream), created over
//     the MPI communicator ProcessGroups keeps for that dimension and the stream's thread
//     slot (compute -> main, local_comm, cross_comm). NCCL serialises the operations of one
//     communicator, and two streams cannot promise to enqueue in the same order on every
//     member, so each stream gets its own, as on the CPU;
//   * pipeline channels: one 2-member communicator per ordered pair of ranks that exchange
//     pipeline messages (runtime/cuda/pipeline_channels.h): sender = member 0, receiver =
//     member 1. The sender uses it only from its send stream, the receiver only from the
//     channel stream of that sender (runtime/cuda/device_streams.h).
//
// Setup order, identical on every rank (every step is collective, so the order is what
// keeps the ranks from waiting on each other in different places):
//   1. the channel agreement (runtime/cuda/channel_agreement.h): the world's channel
//      order, one MPI communicator per channel, and the comparison of both ends' tag lists
//      for each program, which makes every rank throw rt::SetupFailure (kInvalidInput)
//      before any NCCL communicator exists when a message is sent and never received (or
//      the reverse);
//      each receiver keeps its senders' orders (receive_orders);
//   2. collective communicators, in setup.collectives order (the same list on every rank);
//   3. NCCL initialisation of each channel in channel order (a rank joins its own ones;
//      a total order over pairs means the earliest pending pair always has both members
//      waiting on it), then the MPI communicators are freed;
//   4. one 1-element send per channel, in channel order, waited for: NCCL connects
//      point-to-point peers on their first operation, with a host-side handshake; doing it
//      here, in one agreed order, keeps that handshake out of the executor, where a rank
//      posts its receives before its sends.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/parallel_spec.h"
#include "lib/plan/rank_program.h"
#include "runtime/comm/process_groups.h"
#include "runtime/cuda/device_schedule.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/cuda/pipeline_channels.h"
#include "runtime/cuda/stream_lowering.h"

namespace dhelix::cuda {

class ChannelAgreement;

/// A process group's collectives as run by one stream: one NCCL communicator.
struct CollectiveSlot {
  ParallelDim dim = ParallelDim::kTp;
  DeviceStream stream = DeviceStream::kCompute;
};

/// What to create; must be the same on every rank.
struct DeviceCommSetup {
  /// The communicators for collectives: the model's (tp) on local_comm and cross_comm for
  /// co-executed programs and on compute for sequential ones. Each NCCL communicator holds
  /// buffers on the device, so list only those that run something.
  std::vector<CollectiveSlot> collectives = {{ParallelDim::kTp, DeviceStream::kLocalComm},
                                             {ParallelDim::kTp, DeviceStream::kCrossComm}};
  /// The model's layer count, to decode tags in messages.
  int64_t num_layers = 0;
  /// Watchdog timeout of every communicator (world_rank is filled in).
  DeviceCommOptions options;
};

/// Which CommSlot's MPI communicator a stream's collectives are bootstrapped over.
rt::CommSlot comm_slot_of(DeviceStream stream);

class DeviceCommDirectory {
 public:
  /// The setup of the file comment, collective over MPI_COMM_WORLD, on the current CUDA
  /// device. `programs`: every program this rank will execute with these communicators
  /// (e.g. the co-executed and the sequential one); each is checked (step 1).
  DeviceCommDirectory(rt::ProcessGroups& groups, const std::vector<const RankProgram*>& programs,
                      DeviceCommSetup setup);
  ~DeviceCommDirectory();
  DeviceCommDirectory(const DeviceCommDirectory&) = delete;
  DeviceCommDirectory& operator=(const DeviceCommDirectory&) = delete;

  /// The communicator of dimension `dim` ("tp", ...) for `stream`; Error(kInternal) when
  /// the setup did not create it.
  DeviceCommunicator& group(ParallelDim dim, DeviceStream stream);
  /// The channel this rank sends to `peer` on / receives from `peer` on; Error(kInternal)
  /// when there is none.
  DeviceCommunicator& channel_to(int64_t peer);
  DeviceCommunicator& channel_from(int64_t peer);
  /// The world ranks this rank receives from, ascending (DeviceStreams' receive_peers).
  std::vector<int64_t> receive_peers() const;
  /// For a program of `mode` given at setup: per sender (world rank), the tags this rank
  /// receives from it in the sender's send order; Error(kInternal) for another mode.
  const ReceiveOrders& receive_orders(ExecutionMode mode) const;
  /// The world's channels in creation order.
  const std::vector<ChannelPair>& channels() const { return channels_; }
  int64_t world_rank() const { return world_rank_; }

 private:
  void create_collectives(rt::ProcessGroups& groups);
  void create_channels(const ChannelAgreement& agreement);
  void warm_up_channels();

  DeviceCommSetup setup_;
  int64_t world_rank_ = 0;
  std::map<std::pair<ParallelDim, DeviceStream>, std::unique_ptr<DeviceCommunicator>> groups_;
  std::vector<ChannelPair> channels_;
  std::map<ExecutionMode, ReceiveOrders> receive_orders_;
  std::map<int64_t, std::unique_ptr<DeviceCommunicator>> to_;
  std::map<int64_t, std::unique_ptr<DeviceCommunicator>> from_;
};

}  // namespace dhelix::cuda
