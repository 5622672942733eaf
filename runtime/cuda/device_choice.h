#pragma once
// Which GPU a rank uses: one rank per GPU, the rank's index among the ranks of its node.
//
// The index on the node comes from the launcher's environment, read before any MPI
// collective (the ranks have not yet agreed that all of them started; see
// runtime/train/trainer.cc): OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun),
// SLURM_LOCALID (srun), MPI_LOCALRANKID (MPICH and Intel MPI's Hydra). Without any of them
// the world rank is used, which is right on one node. CUDA_VISIBLE_DEVICES, if set, has
// already narrowed the devices this process sees; the index is into those.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dhelix::cuda {

/// Reads one environment variable (std::getenv in production; a map in tests).
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The rank's index on its node and where it came from ("OMPI_COMM_WORLD_LOCAL_RANK", ...,
/// or "world rank").
struct LocalRank {
  int64_t index = 0;
  std::string source;
};

/// The first of the variables above that is set. Throws Error(kInvalidInput) naming the
/// variable when its value is not a non-negative integer.
LocalRank local_rank(const EnvironmentLookup& environment, int64_t world_rank);

/// The device of a rank: its local index, which must be below `device_count`. Throws
/// Error(kUnsupported) when no device is visible or when the node runs more ranks than it
/// has devices ("rank 5 is rank 5 on its node (OMPI_COMM_WORLD_LOCAL_RANK) but the node
/// shows 4 CUDA devices: run one rank per GPU").
int device_for_rank(const LocalRank& local, int64_t world_rank, int device_count);

/// std::getenv as an EnvironmentLookup.
EnvironmentLookup process_environment();

}  // namespace dhelix::cuda
