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
// Set-up order, identical on every rank (every step is collective, so the order is what
// keeps the ranks from waiting on each other in different places):
//   1. the channel agreement (runtime/cuda/channel_agreement.h; plan_over_mpi): the
//      world's channel order, one MPI communicator per channel, and the comparison of both
//      ends' tag lists for each program, which makes every rank throw rt::SetupFailure
//      (kInvalidInput) before any NCCL communicator exists when a message is sent and
//      never received (or the reverse); each receiver keeps its senders' orders;
//   2. collective communicators, in setup.collectives order (the same list on every rank),
//      then the DP x CP gradient group and the expert-data-parallel group when the setup
//      asks for them;
//   3. NCCL initialisation of each channel in channel order (a rank joins its own ones; a
//      total order over pairs means the earliest pending pair always has both members
//      waiting on it);
//   4. warm-up of EVERY communicator, in creation order, on one set-up stream, waited for:
//      every kind of operation the communicator runs in an iteration, at one element, at the
//      iteration's largest size and between (comm_warmup.h): all-gather, reduce-scatter and
//      all-reduce on the TP, DP and gradient groups, a ring step on each CP communicator, a
//      padded all-to-all on each EP communicator (NCCL connects point-to-point peers apart
//      from its collective rings), a send/receive on each channel. NCCL connects peers
//      lazily, per algorithm, on the first operation that picks it, with a host-side
//      handshake; a first large TP all-gather inside iteration 1 would make that handshake
//      while receives spin on the GPU (docs/gpu.md, "iteration 1"). The earliest pending
//      warm-up in the agreed order always has all its members at it, so the set-up cannot
//      deadlock.
// Teardown: ncclCommDestroy is collective, so the destructor destroys the communicators in
// creation order, the same on every rank (before, the members of a std::map went in an
// order that differed per rank: a sender destroyed a channel before or after its receiver
// did depending on which map held it).

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/parallel_spec.h"
#include "lib/placement.h"
#include "lib/plan/rank_program.h"
#include "runtime/comm/process_groups.h"
#include "runtime/cuda/comm_warmup.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/cuda/pipeline_channels.h"
#include "runtime/exec/stream_lowering.h"

namespace dhelix::cuda {

class ChannelAgreement;

/// A process group's collectives as run by one stream: one NCCL communicator.
struct CollectiveSlot {
  CollectiveSlot() = default;
  CollectiveSlot(ParallelDim d, DeviceStream s,
                 std::optional<Placement::CpLevel> level = std::nullopt)
      : dim(d), stream(s), cp_level(level) {}
  ParallelDim dim = ParallelDim::kTp;
  DeviceStream stream = DeviceStream::kCompute;
  /// a2a+p2p: the CP sub-group (rt::ProcessGroups::cp_level) instead of the whole CP group.
  std::optional<Placement::CpLevel> cp_level;
};

/// What to create; must be the same on every rank.
struct DeviceCommSetup {
  /// The communicators for collectives: the model's (tp) on local_comm and cross_comm for
  /// co-executed programs and on compute for sequential ones. Each NCCL communicator holds
  /// buffers on the device, so list only those that run something.
  std::vector<CollectiveSlot> collectives = {{ParallelDim::kTp, DeviceStream::kLocalComm},
                                             {ParallelDim::kTp, DeviceStream::kCrossComm}};
  /// Whether to create the communicator dense gradients are summed over when that is not
  /// the dp group: DP x CP under context parallelism (rt::ProcessGroups::gradient_group),
  /// on the compute stream, after the collectives.
  bool gradient_group = false;
  /// Whether to create the expert-data-parallel group (rt::ProcessGroups::
  /// expert_data_parallel: where MoE experts' gradients are summed under EP), on the
  /// compute stream, after the gradient group.
  bool expert_gradient_group = false;
  /// Its size, dp x cp / ep (0: not known). A group of one has no NCCL communicator
  /// (nccl_communicator.h), so comm_footprint counts no NCCL streams for it.
  int64_t expert_gradient_group_size = 0;
  /// Whether the rank keeps a stream for the gradient reduction of its own
  /// (device_gradient_reducer.h, DeviceStreams::reduction_stream): the DP (or DP x CP) and
  /// expert-data-parallel communicators run there and on no other stream.
  bool reduction_stream = false;
  /// The largest buffer each kind of communicator moves in an iteration: the warm-up's
  /// sizes (step 4; comm_warmup.h). Must be the same on every member of a communicator.
  CommWarmupSizes warmup;
  /// The model's layer count, to decode tags in messages.
  int64_t num_layers = 0;
  /// Watchdog timeout of every communicator (world_rank is filled in).
  DeviceCommOptions options;
  /// Thread blocks a pipeline channel's kernels may occupy (ncclConfig_t::maxCTAs): a
  /// channel's receive kernel is resident from the iteration's start until its message
  /// arrives, so it is capped to leave the SMs to compute (docs/gpu.md, "receives").
  int64_t channel_max_ctas = kChannelMaxCtas;
  static constexpr int64_t kChannelMaxCtas = 2;
};

/// The ncclConfig_t::maxCTAs the runtime gives a communicator of `dim` (0: NCCL's default):
/// pipeline channels (pp) kChannelMaxCtas, every other group none. dhelix-profile makes its
/// communicators with the same (profiler/cuda/cuda_setup.h), so that it times NCCL's kernels
/// on the SMs training gives them.
int64_t runtime_max_ctas(ParallelDim dim);

/// The collective communicators dhelix-run's CUDA engine creates for a job of `parallel`
/// (the same on every rank): TP on every stream that runs the model's collectives (compute:
/// sequential programs and the norm gains' gradient sums); with cp > 1 the CP ring's on the
/// same three streams and the DP x CP gradient group; else with FSDP (the layers' gathers and
/// reduce-scatters, parallel.fsdp_shards_parameters()) and dp > 1 DP on the three streams
/// and the gradient group (DP) apart; else DP when dp > 1; with ep > 1 the EP
/// group's all-to-alls on the three streams and the expert-data-parallel group. The DP, DP x
/// CP and expert-data-parallel groups run on the reduction stream, which is asked for with
/// any of them.
DeviceCommSetup model_comm_setup(const ParallelSpec& parallel);

/// One communicator this rank joins: its size, this rank's member index, and how member
/// 0's unique id reaches the others (an MPI_Bcast; nothing in a simulation).
struct CommMembership {
  std::string name;  ///< "tp (local_comm)", "pp 0->2"
  int64_t size = 1;
  int64_t rank = 0;
  std::function<void(CommId&)> share_id;
};

/// What the ranks agreed on before any NCCL communicator exists (steps 1 of the file
/// comment); the input of DeviceCommDirectory.
struct DeviceCommPlan {
  /// Parallel to setup.collectives.
  std::vector<CommMembership> collectives;
  /// The DP x CP group when setup.gradient_group.
  std::optional<CommMembership> gradient;
  /// The expert-data-parallel group when setup.expert_gradient_group.
  std::optional<CommMembership> expert_gradient;
  /// The world's channels in creation order; channel_members[i] is this rank's membership
  /// of channels[i], nullopt when it is not an end.
  std::vector<ChannelPair> channels;
  std::vector<std::optional<CommMembership>> channel_members;
  /// Per mode given: per sender, the tags this rank receives from it in the sender's order.
  std::map<ExecutionMode, ReceiveOrders> receive_orders;
};

/// What this rank will hold, computed from its own programs before any set-up, so that
/// the streams can be counted (device_streams.h) and the device prepared (device_setup.h)
/// before the first communicator exists: the peers it receives pipeline messages from
/// (ascending) and the number of communicators (collectives + one per channel end).
struct CommFootprint {
  std::vector<int64_t> receive_peers;
  int64_t communicators = 0;
};
CommFootprint comm_footprint(const DeviceCommSetup& setup,
                             const std::vector<const RankProgram*>& programs);

/// Which CommSlot's MPI communicator a stream's collectives are bootstrapped over.
rt::CommSlot comm_slot_of(DeviceStream stream);

class DeviceCommDirectory {
 public:
  /// Steps 2-4 of the file comment on the current device, from a plan every rank made alike.
  DeviceCommDirectory(DeviceApi& api, int64_t world_rank, DeviceCommSetup setup,
                      DeviceCommPlan plan);
  /// Steps 1-4 over MPI_COMM_WORLD. `programs`: every program this rank will execute with
  /// these communicators (e.g. the co-executed and the sequential one); each is checked.
  static std::unique_ptr<DeviceCommDirectory> over_mpi(
      DeviceApi& api, rt::ProcessGroups& groups, const std::vector<const RankProgram*>& programs,
      DeviceCommSetup setup);
  /// Destroys every communicator in creation order (see the file comment).
  ~DeviceCommDirectory();
  DeviceCommDirectory(const DeviceCommDirectory&) = delete;
  DeviceCommDirectory& operator=(const DeviceCommDirectory&) = delete;

  /// The communicator of dimension `dim` for `stream`; Error(kInternal) when the setup did
  /// not create it.
  DeviceCommunicator& group(ParallelDim dim, DeviceStream stream);
  /// a2a+p2p: the CP sub-group's communicator for `stream` (the all-to-alls' or the ring's);
  /// Error(kInternal) when the setup did not create it.
  DeviceCommunicator& cp_level(Placement::CpLevel level, DeviceStream stream);
  /// Whether the setup split CP into a2a+p2p's sub-groups.
  bool has_cp_levels() const { return !cp_levels_.empty(); }
  /// The DP x CP gradient group (setup.gradient_group); Error(kInternal) without one.
  DeviceCommunicator& gradient_group();
  /// The expert-data-parallel group (setup.expert_gradient_group); Error(kInternal) without.
  DeviceCommunicator& expert_gradient_group();
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
  /// Communicators this rank holds backed by NCCL (each keeps NCCL streams of its own); a
  /// group of one is held but not counted (nccl_communicator.h).
  int64_t size() const {
    return static_cast<int64_t>(std::count_if(created_.begin(), created_.end(),
                                              [](const auto& comm) { return comm->has_nccl(); }));
  }

 private:
  void create(DeviceCommPlan& plan);
  void warm_up();
  /// Step 4's operations for one communicator this rank created (comm_warmup.h).
  std::vector<WarmupOp> warmup_of(const DeviceCommunicator* comm) const;
  void destroy_in_order() noexcept;

  DeviceApi& api_;
  DeviceCommSetup setup_;
  int64_t world_rank_ = 0;
  std::vector<ChannelPair> channels_;
  std::map<ExecutionMode, ReceiveOrders> receive_orders_;
  std::vector<std::unique_ptr<DeviceCommunicator>> created_;  // creation order = destroy order
  std::map<std::pair<ParallelDim, DeviceStream>, DeviceCommunicator*> groups_;
  std::map<std::pair<Placement::CpLevel, DeviceStream>, DeviceCommunicator*> cp_levels_;
  DeviceCommunicator* gradient_ = nullptr;
  DeviceCommunicator* expert_gradient_ = nullptr;
  std::map<int64_t, DeviceCommunicator*> to_;
  std::map<int64_t, DeviceCommunicator*> from_;
};

}  // namespace dhelix::cuda
