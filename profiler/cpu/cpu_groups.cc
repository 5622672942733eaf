#include "profiler/cpu/cpu_groups.h"

#include <mpi.h>

#include <string>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"

namespace dhelix::cpu_profile {

MeasureGroups::MeasureGroups(const std::vector<int64_t>& group_sizes, int64_t world_rank,
                             int64_t world_size) {
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
}

CommBinding MeasureGroups::binding(int64_t group_size, int strand) const {
  const auto it = groups_.find(group_size);
  DHELIX_CHECK(it != groups_.end() && strand >= 0 && strand < kStrands);
  rt::MpiCommunicator* comm = it->second[static_cast<size_t>(strand)].get();
  if (comm == nullptr) return {};
  return {.comm = comm, .world_ranks = comm->world_ranks()};
}

}  // namespace dhelix::cpu_profile
