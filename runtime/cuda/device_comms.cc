#include "runtime/cuda/device_comms.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <set>
#include <thread>

#include "lib/error.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cuda/channel_agreement.h"

namespace dhelix::cuda {
namespace {

std::string slot_name(const CollectiveSlot& slot) {
  const std::string group = !slot.cp_level ? parallel_dim_name(slot.dim)
                            : *slot.cp_level == Placement::CpLevel::kA2a ? "cp a2a"
                                                                         : "cp ring";
  return fmt::format("{} ({})", group, device_stream_name(slot.stream));
}

// A membership whose id travels over `group` (an MPI communicator held until creation).
CommMembership over_mpi_group(MPI_Comm group, std::string name) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(group, &size);
  MPI_Comm_rank(group, &rank);
  return {.name = std::move(name), .size = size, .rank = rank, .share_id = [group](CommId& id) {
            const int status =
                MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group);
            if (status != MPI_SUCCESS) {
              throw Error(ErrorCode::kInternal,
                          fmt::format("MPI_Bcast of the unique id failed ({})", status));
            }
          }};
}

}  // namespace

CommFootprint comm_footprint(const DeviceCommSetup& setup,
                             const std::vector<const RankProgram*>& programs) {
  std::set<int64_t> senders;
  std::set<int64_t> receivers;
  for (const RankProgram* program : programs) {
    for (const ChannelMessages& messages : channel_messages(*program)) {
      if (!messages.received_tags.empty()) senders.insert(messages.peer);
      if (!messages.sent_tags.empty()) receivers.insert(messages.peer);
    }
  }
  return {.receive_peers = {senders.begin(), senders.end()},
          .communicators = static_cast<int64_t>(
              setup.collectives.size() + (setup.gradient_group ? 1 : 0) +
              (setup.expert_gradient_group && setup.expert_gradient_group_size != 1 ? 1 : 0) +
              senders.size() + receivers.size())};
}

int64_t runtime_max_ctas(ParallelDim dim) {
  return dim == ParallelDim::kPp ? DeviceCommSetup::kChannelMaxCtas : 0;
}

DeviceCommSetup model_comm_setup(const ParallelSpec& parallel) {
  DeviceCommSetup setup;
  constexpr std::array<DeviceStream, 3> kStreams = {
      DeviceStream::kCompute, DeviceStream::kLocalComm, DeviceStream::kCrossComm};
  setup.collectives.clear();
  if (parallel.tp > 1) {
    for (DeviceStream stream : kStreams) setup.collectives.push_back({ParallelDim::kTp, stream});
  }
  if (parallel.cp > 1) {
    // The ring's steps run on whichever stream the plan gives them (the sequential
    // program: compute); dense gradients are summed over DP x CP (process_groups.h).
    // a2a+p2p runs its all-to-alls and its ring over CP sub-groups, each level's own.
    if (parallel.cp_comm_type == CpCommType::kA2aP2p) {
      for (Placement::CpLevel level : {Placement::CpLevel::kA2a, Placement::CpLevel::kRing}) {
        for (DeviceStream stream : kStreams) {
          setup.collectives.push_back({ParallelDim::kCp, stream, level});
        }
      }
    } else {
      for (DeviceStream stream : kStreams) setup.collectives.push_back({ParallelDim::kCp, stream});
    }
    setup.gradient_group = true;
  } else if (parallel.dp > 1 && parallel.fsdp_shards_parameters()) {
    // FSDP's layer gathers and reduce-scatters run on whichever stream the plan gives them
    // (runtime/model/fsdp_layers.h); the other parameters' gradients are summed over a DP
    // communicator of their own on the reduction stream, never shared with those streams.
    for (DeviceStream stream : kStreams) setup.collectives.push_back({ParallelDim::kDp, stream});
    setup.gradient_group = true;
  } else if (parallel.dp > 1) {
    setup.collectives.push_back({ParallelDim::kDp, DeviceStream::kCompute});
  }
  if (parallel.ep > 1) {
    // The MoE dispatch and combine run on whichever stream the plan gives them; experts'
    // gradients are summed over the expert-data-parallel group (process_groups.h).
    for (DeviceStream stream : kStreams) setup.collectives.push_back({ParallelDim::kEp, stream});
    setup.expert_gradient_group = true;
    setup.expert_gradient_group_size = parallel.dp * parallel.cp / parallel.ep;
  }
  setup.reduction_stream = parallel.cp > 1 || parallel.dp > 1 || parallel.ep > 1;
  return setup;
}

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

std::unique_ptr<DeviceCommDirectory> DeviceCommDirectory::over_mpi(
    DeviceApi& api, rt::ProcessGroups& groups, const std::vector<const RankProgram*>& programs,
    DeviceCommSetup setup) {
  const int64_t world_rank = groups.world_rank();
  // The agreement first: when it refuses the programs, every rank throws here alike, before
  // any NCCL communicator exists. It holds the channels' MPI communicators until NCCL is
  // initialised over them, then frees them.
  ChannelAgreement agreement(programs, world_rank, setup.num_layers);
  DeviceCommPlan plan;
  for (const CollectiveSlot& slot : setup.collectives) {
    auto* mpi = dynamic_cast<rt::MpiCommunicator*>(
        slot.cp_level ? &groups.cp_level(*slot.cp_level, comm_slot_of(slot.stream))
                      : &groups.group(slot.dim, comm_slot_of(slot.stream)));
    DHELIX_CHECK_MSG(mpi != nullptr, "ProcessGroups holds MPI communicators");
    plan.collectives.push_back(over_mpi_group(mpi->handle(), slot_name(slot)));
  }
  if (setup.gradient_group) {
    auto* mpi = dynamic_cast<rt::MpiCommunicator*>(&groups.gradient_group());
    DHELIX_CHECK_MSG(mpi != nullptr, "ProcessGroups holds MPI communicators");
    plan.gradient = over_mpi_group(mpi->handle(), "dp x cp (compute)");
  }
  if (setup.expert_gradient_group) {
    auto* mpi = dynamic_cast<rt::MpiCommunicator*>(&groups.expert_data_parallel());
    DHELIX_CHECK_MSG(mpi != nullptr, "ProcessGroups holds MPI communicators");
    plan.expert_gradient = over_mpi_group(mpi->handle(), "expert dp (compute)");
  }
  plan.channels = agreement.channels();
  for (size_t i = 0; i < plan.channels.size(); ++i) {
    const ChannelPair& pair = plan.channels[i];
    if (agreement.communicator(i) == MPI_COMM_NULL) {
      plan.channel_members.emplace_back();
    } else {
      plan.channel_members.push_back(over_mpi_group(
          agreement.communicator(i), fmt::format("pp {}->{}", pair.sender, pair.receiver)));
    }
  }
  plan.receive_orders = agreement.receive_orders();
  return std::make_unique<DeviceCommDirectory>(api, world_rank, std::move(setup), std::move(plan));
}

DeviceCommDirectory::DeviceCommDirectory(DeviceApi& api, int64_t world_rank, DeviceCommSetup setup,
                                         DeviceCommPlan plan)
    : api_(api), setup_(std::move(setup)), world_rank_(world_rank) {
  setup_.options.world_rank = world_rank_;
  DHELIX_CHECK(plan.collectives.size() == setup_.collectives.size());
  DHELIX_CHECK(plan.gradient.has_value() == setup_.gradient_group);
  DHELIX_CHECK(plan.expert_gradient.has_value() == setup_.expert_gradient_group);
  DHELIX_CHECK(plan.channel_members.size() == plan.channels.size());
  channels_ = plan.channels;
  receive_orders_ = plan.receive_orders;
  try {
    create(plan);
    warm_up();
  } catch (...) {
    destroy_in_order();
    throw;
  }
}

DeviceCommDirectory::~DeviceCommDirectory() { destroy_in_order(); }

void DeviceCommDirectory::destroy_in_order() noexcept {
  for (auto& comm : created_) comm->destroy();
  created_.clear();
}

void DeviceCommDirectory::create(DeviceCommPlan& plan) {
  const auto join = [&](CommMembership& member, int64_t max_ctas) {
    DeviceCommOptions options = setup_.options;
    options.max_ctas = max_ctas;
    created_.push_back(std::make_unique<DeviceCommunicator>(api_, member.size, member.rank,
                                                            member.name, member.share_id, options));
    return created_.back().get();
  };
  for (size_t i = 0; i < setup_.collectives.size(); ++i) {
    const CollectiveSlot& slot = setup_.collectives[i];
    DeviceCommunicator* comm = join(plan.collectives[i], runtime_max_ctas(slot.dim));
    if (slot.cp_level) {
      cp_levels_[{*slot.cp_level, slot.stream}] = comm;
    } else {
      groups_[{slot.dim, slot.stream}] = comm;
    }
  }
  if (plan.gradient) gradient_ = join(*plan.gradient, 0);
  if (plan.expert_gradient) expert_gradient_ = join(*plan.expert_gradient, 0);
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (!plan.channel_members[i]) continue;
    const ChannelPair& pair = channels_[i];
    DeviceCommunicator* comm = join(*plan.channel_members[i], setup_.channel_max_ctas);
    if (pair.sender == world_rank_) {
      to_[pair.receiver] = comm;
    } else {
      from_[pair.sender] = comm;
    }
  }
}

std::vector<WarmupOp> DeviceCommDirectory::warmup_of(const DeviceCommunicator* comm) const {
  const CommWarmupSizes& sizes = setup_.warmup;
  const auto is = [&](const auto& map) {
    return std::any_of(map.begin(), map.end(),
                       [&](const auto& entry) { return entry.second == comm; });
  };
  const auto group_of = [&]() -> std::optional<ParallelDim> {
    for (const auto& [key, member] : groups_) {
      if (member == comm) return key.first;
    }
    return std::nullopt;
  };
  const int64_t members = comm->size();
  for (const auto& [key, member] : cp_levels_) {  // a2a+p2p: the all-to-alls', the ring's
    if (member != comm) continue;
    return key.first == Placement::CpLevel::kA2a
               ? comm_warmup_ops(CommRole::kAllToAll, sizes.cp_a2a, DeviceDtype::kBFloat16, members)
               : comm_warmup_ops(CommRole::kRing, sizes.cp, DeviceDtype::kBFloat16, members);
  }
  if (is(to_)) return comm_warmup_ops(CommRole::kSend, sizes.channel, DeviceDtype::kBFloat16, 2);
  if (is(from_)) return comm_warmup_ops(CommRole::kRecv, sizes.channel, DeviceDtype::kBFloat16, 2);
  const std::optional<ParallelDim> dim = group_of();
  if (dim == ParallelDim::kCp) {
    // The ring's grouped send/recvs, all-gather CP's collectives or Ulysses' all-to-alls.
    return comm_warmup_ops(sizes.cp_role, sizes.cp, DeviceDtype::kBFloat16, members);
  }
  if (dim == ParallelDim::kEp) {
    return comm_warmup_ops(CommRole::kAllToAll, sizes.ep, DeviceDtype::kBFloat16, members);
  }
  if (dim == ParallelDim::kTp) {
    return comm_warmup_ops(CommRole::kCollectives, sizes.tp, DeviceDtype::kBFloat16, members);
  }
  // DP, the DP x CP gradient group and the expert-data-parallel group: fp32 gradient
  // buckets, all-reduced or (distributed optimizer) reduce-scattered and all-gathered.
  const int64_t largest = comm == expert_gradient_ ? sizes.expert_dp : sizes.dp;
  return comm_warmup_ops(CommRole::kCollectives, largest, DeviceDtype::kFloat32, members);
}

void DeviceCommDirectory::warm_up() {
  if (created_.empty()) return;
  // Creation order: collectives, then channels in channel order (see the file comment).
  // Each communicator runs every kind of operation it will run, at every size class
  // (comm_warmup.h): NCCL connects each algorithm, and point-to-point peers apart from its
  // collective rings, on first use.
  std::vector<std::vector<WarmupOp>> ops;
  int64_t buffer_bytes = 1, largest = 1;
  for (const auto& comm : created_) {
    ops.push_back(warmup_of(comm.get()));
    buffer_bytes = std::max(buffer_bytes, warmup_buffer_bytes(ops.back(), comm->size()));
    largest = std::max(largest, comm->size());
  }
  StreamHandle stream = api_.create_stream(false);
  void* scratch = nullptr;
  struct Release {
    DeviceApi& api;
    StreamHandle stream;
    void** scratch;
    ~Release() {
      api.free_scratch(*scratch);
      api.destroy_stream(stream);
    }
  } release{api_, stream, &scratch};
  // in and out, then the all-to-all's send and receive counts (int64, one per member).
  constexpr int64_t kAlign = 256;
  const int64_t side = (buffer_bytes + kAlign - 1) / kAlign * kAlign;
  scratch = api_.allocate_scratch(2 * side + 2 * largest * static_cast<int64_t>(sizeof(int64_t)));
  char* const in = static_cast<char*>(scratch);
  char* const out = in + side;
  int64_t* const counts = reinterpret_cast<int64_t*>(out + side);
  for (size_t c = 0; c < created_.size(); ++c) {
    DeviceCommunicator& comm = *created_[c];
    for (const WarmupOp& op : ops[c]) {
      switch (op.role) {
        case CommRole::kCollectives:
          if (op.op == CollectiveOp::kAllGather) {
            comm.all_gather(in, op.count, op.dtype, out, stream);
          } else if (op.op == CollectiveOp::kReduceScatterSum) {
            comm.reduce_scatter_sum(in, op.count, op.dtype, out, stream);
          } else {
            comm.all_reduce_sum(in, op.count, op.dtype, stream);
          }
          break;
        case CommRole::kRing:
          comm.ring_exchange(in, out, op.count, op.dtype, stream);
          break;
        case CommRole::kAllToAll:
          comm.all_to_all_v(in, counts, 1, out, counts + comm.size(), op.count, op.dtype, stream);
          break;
        case CommRole::kSend:
          comm.send(in, op.count, op.dtype, 1, stream);
          break;
        case CommRole::kRecv:
          comm.recv(out, op.count, op.dtype, 0, stream);
          break;
      }
    }
  }
  // Every communicator polled while the host waits: a peer that never arrives ends the
  // wait with its NCCL error or the timeout, not a silent hang.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point since = Clock::now();
  while (!api_.stream_done(stream)) {
    for (const auto& comm : created_) comm->poll();
    if (std::chrono::duration<double>(Clock::now() - since).count() > setup_.options.timeout_s) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("rank {}: the warm-up of the NCCL communicators did not finish "
                              "within {} s (a peer rank did not reach its set-up)",
                              world_rank_, setup_.options.timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
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

DeviceCommunicator& DeviceCommDirectory::cp_level(Placement::CpLevel level, DeviceStream stream) {
  const auto it = cp_levels_.find({level, stream});
  if (it == cp_levels_.end()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("no NCCL communicator for the CP {} sub-group on the {} stream (the "
                            "device setup created none)",
                            level == Placement::CpLevel::kA2a ? "a2a" : "ring",
                            device_stream_name(stream)));
  }
  return *it->second;
}

DeviceCommunicator& DeviceCommDirectory::gradient_group() {
  if (gradient_ == nullptr) {
    throw Error(ErrorCode::kInternal,
                "no NCCL communicator for the dp x cp gradient group (the device setup "
                "created none)");
  }
  return *gradient_;
}

DeviceCommunicator& DeviceCommDirectory::expert_gradient_group() {
  if (expert_gradient_ == nullptr) {
    throw Error(ErrorCode::kInternal,
                "no NCCL communicator for the expert-data-parallel gradient group (the device "
                "setup created none)");
  }
  return *expert_gradient_;
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
