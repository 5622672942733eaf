#include "profiler/cpu/cpu_groups.h"

#include <mpi.h>

#include <string>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"

namespace dhelix::cpu_profile {

MeasureGroups::MeasureGroups(const std::vector<int64_t>& group_sizes, int64_t world_rank,
                             int64_t world_size, const rt::LinkEmulation& emulation) {
  MPI_Comm world = MPI_COMM_NULL;
  rt::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  world_ = std::make_unique<rt::MpiCommunicator>(world, "world");
  for (const int64_t size : group_sizes) {
    DHELIX_CHECK(size >= 1);
    if (groups_.contains(size)) continue;
    auto& slots = groups_[size];
    const bool member = world_rank < world_size / size * size;
    const int colour = member ? static_cast<int>(world_rank / size) : MPI_UNDEFINED;
    for (int strand = 0; strand < kStrands; ++strand) {
      MPI_Comm comm = MPI_COMM_NULL;
      rt::check_mpi(MPI_Comm_split(MPI_COMM_WORLD, colour, static_cast<int>(world_rank), &comm),
                    "MPI_Comm_split");
      if (comm != MPI_COMM_NULL) {
        slots[static_cast<size_t>(strand)] = std::make_unique<rt::MpiCommunicator>(
            comm, "group of " + std::to_string(size) + " strand " + std::to_string(strand));
      }
    }
  }
  for (const ParallelDim kind : kParallelDimNames.values()) {
    const rt::LinkRate* rate = emulation.rate(kind);
    if (rate == nullptr) continue;
    rt::EmulatedLink* link =
        (links_[static_cast<size_t>(kind)] = std::make_unique<rt::EmulatedLink>(*rate)).get();
    for (auto& [size, slots] : groups_) {
      for (const auto& comm : slots) {
        if (!comm) continue;
        wrapped_[{comm.get(), kind}] =
            std::make_unique<rt::EmulatedLinkCommunicator>(*comm, link, link);
      }
    }
  }
}

CommBinding MeasureGroups::binding(int64_t group_size, int strand, ParallelDim kind) const {
  const auto it = groups_.find(group_size);
  DHELIX_CHECK(it != groups_.end() && strand >= 0 && strand < kStrands);
  rt::MpiCommunicator* comm = it->second[static_cast<size_t>(strand)].get();
  if (comm == nullptr) return {};
  const auto wrapper = wrapped_.find({comm, kind});
  rt::Communicator* used =
      wrapper == wrapped_.end() ? static_cast<rt::Communicator*>(comm) : wrapper->second.get();
  return {.comm = used, .world_ranks = comm->world_ranks()};
}

}  // namespace dhelix::cpu_profile
