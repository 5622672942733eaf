#include "runtime/comm/process_groups.h"

#include <fmt/format.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"

namespace dhelix::rt {
namespace {

int64_t dim_size(const Placement& placement, ParallelDim dim) {
  return static_cast<int64_t>(placement.group(dim, 0).ranks.size());
}

// "dp 1 x tp 2 x pp 2" (cp only when it is used), for the size-mismatch message.
std::string shape_text(const Placement& placement) {
  std::string text = "dp " + std::to_string(dim_size(placement, ParallelDim::kDp)) + " x tp " +
                     std::to_string(dim_size(placement, ParallelDim::kTp));
  const int64_t cp = dim_size(placement, ParallelDim::kCp);
  if (cp > 1) text += " x cp " + std::to_string(cp);
  return text + " x pp " + std::to_string(dim_size(placement, ParallelDim::kPp));
}

}  // namespace

std::vector<int64_t> dp_cp_members(const Placement& placement, int64_t rank) {
  const RankCoordinates own = placement.coordinates(rank);
  std::vector<int64_t> members;
  for (int64_t r = 0; r < placement.world_size(); ++r) {
    const RankCoordinates c = placement.coordinates(r);
    if (c.tp == own.tp && c.pp == own.pp) members.push_back(r);
  }
  return members;
}

namespace {

int world_size_of_mpi() {
  int size = 0;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  return size;
}

std::unique_ptr<MpiCommunicator> split_world(int colour, int key, const char* name) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, colour, key, &comm), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(comm, name);
}

}  // namespace

const char* comm_slot_name(CommSlot slot) {
  switch (slot) {
    case CommSlot::kMain:
      return "main";
    case CommSlot::kLocalComm:
      return "local-comm";
    case CommSlot::kCrossComm:
      return "cross-comm";
  }
  return "?";
}

ProcessGroups::ProcessGroups(const Placement& placement, int64_t world_rank,
                             const LinkEmulation& emulation, int64_t cp_a2a_size)
    : world_rank_(world_rank) {
  // Every rank sees the same sizes, so every rank throws here alike and none is left
  // waiting in a split below.
  const int mpi_size = world_size_of_mpi();
  if (mpi_size != placement.world_size()) {
    throw Error(ErrorCode::kInvalidInput,
                "the plan needs " + std::to_string(placement.world_size()) + " ranks (" +
                    shape_text(placement) + "), mpirun started " + std::to_string(mpi_size));
  }
  int mpi_rank = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
  DHELIX_CHECK_MSG(mpi_rank == world_rank, "world_rank differs from MPI_Comm_rank");

  const int key = static_cast<int>(world_rank);
  for (size_t d = 0; d < kDims.size(); ++d) {
    const ProcessGroup group = placement.group(kDims[d], world_rank);
    const int colour = static_cast<int>(group.ranks.front());
    for (auto& slot : groups_[d]) slot = split_world(colour, key, parallel_dim_name(kDims[d]));
  }
  for (auto& slot : worlds_) slot = split_world(0, key, "world");
  const int64_t cp = dim_size(placement, ParallelDim::kCp);
  if (cp > 1) {
    const std::vector<int64_t> members = dp_cp_members(placement, world_rank);
    dp_cp_ = split_world(static_cast<int>(members.front()), key, "dp x cp");
  }
  const std::vector<int64_t> expert_dp = expert_data_parallel_ranks(placement, world_rank);
  expert_dp_ = split_world(static_cast<int>(expert_dp.front()), key, "expert-dp");
  const ProcessGroup tp = placement.group(ParallelDim::kTp, world_rank);
  reduction_tp_ = split_world(static_cast<int>(tp.ranks.front()), key, "tp");
  const std::vector<int64_t> dp_cp = dp_cp_members(placement, world_rank);
  reduction_dp_cp_ = split_world(static_cast<int>(dp_cp.front()), key, cp > 1 ? "dp x cp" : "dp");
  reduction_expert_dp_ = split_world(static_cast<int>(expert_dp.front()), key, "expert-dp");
  if (cp_a2a_size > 1) {
    for (const Placement::CpLevel level : {Placement::CpLevel::kA2a, Placement::CpLevel::kRing}) {
      const ProcessGroup sub = placement.cp_sub_group(world_rank, cp_a2a_size, level);
      for (auto& slot : cp_levels_[static_cast<size_t>(level)]) {
        slot = split_world(static_cast<int>(sub.ranks.front()), key,
                           level == Placement::CpLevel::kA2a ? "cp a2a" : "cp ring");
      }
    }
  }
  if (emulation.enabled()) wrap_for_emulation(emulation);
}

Communicator& ProcessGroups::cp_level(Placement::CpLevel level, CommSlot slot) {
  const auto& comm = cp_levels_[static_cast<size_t>(level)][static_cast<size_t>(slot)];
  if (!comm) return group(ParallelDim::kCp, slot);
  return emulated(comm);
}

void ProcessGroups::wrap_for_emulation(const LinkEmulation& emulation) {
  // Clock readings are compared across ranks (a send's start travels to its receiver):
  // every rank must read the same CLOCK_MONOTONIC. Every rank sees the same answer, so
  // every rank throws alike.
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
            "MPI_Comm_split_type");
  int on_host = 0, world = 0;
  MPI_Comm_size(host, &on_host);
  MPI_Comm_free(&host);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (on_host != world) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("--emulate-link: {} of the {} ranks share this host; the emulated "
                            "link needs every rank on one host (it compares their clocks)",
                            on_host, world));
  }
  for (const ParallelDim kind : kParallelDimNames.values()) {
    if (const LinkRate* rate = emulation.rate(kind)) {
      links_[static_cast<size_t>(kind)] = std::make_unique<EmulatedLink>(*rate);
    }
  }
  const auto link = [this](ParallelDim kind) { return links_[static_cast<size_t>(kind)].get(); };
  for (size_t d = 0; d < kDims.size(); ++d) {
    for (const auto& slot : groups_[d]) wrap(slot, link(kDims[d]), link(kDims[d]));
  }
  for (const auto& slot : worlds_) wrap(slot, nullptr, link(ParallelDim::kPp));
  for (const auto* comm : {&dp_cp_, &expert_dp_, &reduction_dp_cp_, &reduction_expert_dp_}) {
    if (*comm) wrap(*comm, link(ParallelDim::kDp), link(ParallelDim::kDp));
  }
  wrap(reduction_tp_, link(ParallelDim::kTp), link(ParallelDim::kTp));
  emulation_text_ = emulation.describe();
}

std::vector<std::pair<ParallelDim, LinkLateness>> ProcessGroups::link_lateness() const {
  std::vector<std::pair<ParallelDim, LinkLateness>> all;
  for (const ParallelDim kind : kParallelDimNames.values()) {
    if (const auto& link = links_[static_cast<size_t>(kind)])
      all.emplace_back(kind, link->lateness());
  }
  return all;
}

void ProcessGroups::wrap(const std::unique_ptr<MpiCommunicator>& comm, EmulatedLink* collectives,
                         EmulatedLink* transfers) {
  if (collectives == nullptr && transfers == nullptr) return;
  wrapped_[comm.get()] = std::make_unique<EmulatedLinkCommunicator>(*comm, collectives, transfers);
}

Communicator& ProcessGroups::emulated(const std::unique_ptr<MpiCommunicator>& comm) {
  const auto found = wrapped_.find(comm.get());
  if (found == wrapped_.end()) return *comm;
  return *found->second;
}

std::vector<int64_t> ProcessGroups::expert_data_parallel_ranks(const Placement& placement,
                                                               int64_t world_rank) {
  const RankCoordinates own = placement.coordinates(world_rank);
  std::vector<int64_t> ranks;
  for (int64_t rank = 0; rank < placement.world_size(); ++rank) {
    const RankCoordinates c = placement.coordinates(rank);
    if (c.tp == own.tp && c.pp == own.pp && c.ep == own.ep) ranks.push_back(rank);
  }
  return ranks;
}

Communicator& ProcessGroups::group(ParallelDim dim, CommSlot slot) {
  for (size_t d = 0; d < kDims.size(); ++d) {
    if (kDims[d] == dim) return emulated(groups_[d][static_cast<size_t>(slot)]);
  }
  throw Error(ErrorCode::kUnsupported, std::string("no communicator for the ") +
                                           parallel_dim_name(dim) +
                                           " dimension (the runtime has tp, cp, dp, pp and ep)");
}

Communicator& ProcessGroups::gradient_group() {
  return dp_cp_ ? emulated(dp_cp_) : group(ParallelDim::kDp, CommSlot::kMain);
}

Communicator& ProcessGroups::world(CommSlot slot) {
  return emulated(worlds_[static_cast<size_t>(slot)]);
}

}  // namespace dhelix::rt
