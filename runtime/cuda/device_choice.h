#pragma once
// Which GPU a rank uses, for every tool that runs one rank per GPU (dhelix-profile
// --backend cuda, dhelix-run --backend cuda). Free of CUDA headers: tested without a GPU.
//
// The rank's index on its node comes from the launcher's environment: OMPI_COMM_WORLD_
// LOCAL_RANK (Open MPI's mpirun), SLURM_LOCALID (srun), MPI_LOCALRANKID (MPICH and Intel
// MPI's Hydra). Without them the caller decides: dhelix-profile asks MPI
// (MPI_Comm_split_type); dhelix-run, whose ranks must not communicate before they agree
// that all of them started, takes the world rank, which is right on one node.

#include <cstdint>
#include <functional>

namespace dhelix::cuda {

/// Looks up an environment variable (std::getenv in production); null when unset.
using EnvLookup = std::function<const char*(const char* name)>;

/// The rank's index among the ranks of its node: the first of OMPI_COMM_WORLD_LOCAL_RANK,
/// SLURM_LOCALID and MPI_LOCALRANKID set to a non-negative integer; -1 when none is.
int64_t local_rank_from_environment(const EnvLookup& env);

/// The CUDA device a rank uses: device 0 when it sees one GPU (srun --gpus-per-task=1,
/// or CUDA_VISIBLE_DEVICES set per rank), else its local rank. Throws Error(kInvalidInput)
/// "rank 9: local rank 9 but 8 GPUs are visible (CUDA_VISIBLE_DEVICES=<value or unset>):
/// start one rank per GPU" when the local rank has no GPU. device_count >= 1.
int choose_device(int64_t world_rank, int64_t local_rank, int device_count,
                  const char* cuda_visible_devices);

}  // namespace dhelix::cuda
