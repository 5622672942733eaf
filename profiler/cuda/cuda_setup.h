#pragma once
// Host-side set-up logic of the cuda profiler backend, free of CUDA headers so that it is
// tested on machines without a GPU (which GPU a rank takes: runtime/cuda/device_choice.h):
// whether mpirun or srun placed
// the ranks as the job's Placement assumes, in which order NCCL communicators are made,
// the progress line with the time left, and the operands GEMMs multiply.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/dtype.h"
#include "lib/placement.h"
#include "profiler/model_backend.h"

namespace dhelix::cuda_profile {

/// Ranks the cuda backend needs: every GPU of the job (Placement's world size). Throws
/// Error(kInvalidInput) "the cuda backend profiles on every GPU of the job (tp 2 x cp 1 x
/// dp 2 x pp 2 = 8 ranks): run mpirun -np 8 dhelix-profile --backend cuda ... (this run
/// has 1 rank)" otherwise.
void check_cuda_world_size(const JobSpec& job, int64_t world_size);

/// "" when hosts[r] (the host of world rank r) puts rank r on node r / gpus_per_node, as
/// Placement assumes; else a message naming the first rank that breaks it and how to place
/// ranks in blocks (mpirun --map-by ppr:<g>:node, srun --distribution=block).
std::string node_layout_problem(const std::vector<std::string>& hosts, int64_t gpus_per_node);

/// Process-group dimensions of the communication ops of `space` with groups of 2 or more
/// ranks, in first-seen order (the order every rank makes their communicators in).
std::vector<ParallelDim> communication_dims(const ProfileSpace& space);

/// How one rank joins the NCCL communicator of its group of one dimension: MPI_Comm_split
/// with color `root` (the world rank of the group's first member, unique per group) and
/// key `key`, then the member with key 0 makes the NCCL unique id and broadcasts it.
struct NcclGroupSetup {
  ParallelDim dim = ParallelDim::kTp;
  int64_t root = 0;  ///< world rank of the group's first member: the split colour
  int64_t key = 0;   ///< the rank's index within its group (its NCCL rank)
  int64_t size = 1;  ///< ranks in the group
  /// ncclConfig_t::maxCTAs, the runtime's for the dimension (runtime/cuda/device_comms.h,
  /// runtime_max_ctas: 2 for pipeline channels); 0: NCCL's default.
  int64_t max_ctas = 0;
};
/// One setup per dimension of `dims`, in that order, for world rank `rank`.
std::vector<NcclGroupSetup> nccl_group_setups(const Placement& placement,
                                              const std::vector<ParallelDim>& dims, int64_t rank);

/// "[##########..........] 12/40, 1:05 left": a bar of `width` characters and the time
/// left extrapolated from `elapsed_s` at the mean rate so far ("?" before the first item).
std::string progress_line(int64_t done, int64_t total, double elapsed_s, int width = 30);

/// A progress reporter on stderr: on a terminal one line redrawn after every item with
/// progress_line and `label` in front; elsewhere (a Slurm log) a line at every tenth of the
/// work, so that logs stay short. Times from std::chrono::steady_clock, from this call on.
ProgressCallback timed_progress_bar(const std::string& label);

/// "0:07", "12:34", "1:02:03".
std::string format_duration(double seconds);

/// `elements` finite values of `dtype` with random sign and magnitude in [1/32, 1), as the
/// little-endian bytes a device buffer holds: GEMM operands that are neither zero (tensor
/// cores draw less power on zeros, and clock higher) nor large enough to overflow.
std::vector<unsigned char> random_operand_bytes(DType dtype, int64_t elements, uint64_t seed);

}  // namespace dhelix::cuda_profile
