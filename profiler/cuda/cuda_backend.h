#pragma once
// The measuring `cuda` profiler backend: times every op signature of a job's profile space
// (collect_profile_space, model_backend.h) and every pair in it on real GPUs, with cuBLAS
// GEMMs and NCCL collectives (cuda_op_plan.h says what runs for each kind), and returns a
// profile of the same shape as the model backend's with backend "cuda". docs/gpu.md says
// how to run it.
//
// It runs on every GPU of the job, one MPI rank per GPU (mpirun or srun), with ranks placed
// in blocks of gpus_per_node per node, so that every collective runs on the very groups,
// links and NICs training will use, all groups of a dimension at once as in training.
//
// Every rank measures every op and pair (timing with CUDA events: cuda_timer.h); the
// number of samples follows sampling::SamplingPolicy, agreed on by all ranks after each
// round (an MPI_Allreduce), since collectives need every member. Rank 0 gathers all ranks'
// samples: an op's time_us summarises the pooled samples of every rank (outliers removed,
// profiler/sampling.h), so min and max span all GPUs; meta.measurement.rank_spread keeps the
// min, median and max over ranks of each rank's own median and the slowest rank; a pair's
// finish times are the medians of the pooled samples, fitted as the cpu backend fits them
// (cpu_profile::pair_from_samples: never below the solo medians, OEF >= -1).

#include <cstdint>

#include "lib/job_spec.h"
#include "lib/json_reader.h"
#include "lib/profile.h"
#include "profiler/model_backend.h"
#include "profiler/sampling.h"

namespace dhelix {

/// How the cuda backend measures, and where this process stands in the MPI job.
struct CudaProfileOptions {
  sampling::SamplingPolicy sampling;
  int64_t world_rank = 0;  ///< this process's rank in MPI_COMM_WORLD
  int64_t world_size = 1;  ///< ranks in MPI_COMM_WORLD
};

/// Throws the no-device Error(kUnsupported) ("--backend cuda: no CUDA device found
/// (cudaGetDeviceCount: ...)") unless this process sees a GPU. Needs no MPI.
void check_cuda_device_present();

/// Measures the profile of `job`. Collective over MPI_COMM_WORLD (initialised, world size
/// checked by cuda_profile::check_cuda_world_size first). Picks this rank's GPU (cuda_setup.h
/// choose_device), checks the ranks' placement on nodes, then measures. `meta` is stored
/// with a "measurement" object added (backend, ranks, sampling, device and library
/// versions, NCCL and CUDA environment, approximate ops, rank spread). The returned profile
/// is complete on rank 0; other ranks return one made from their own samples.
Profile make_cuda_profile(const JobSpec& job, const OrderedJson& meta,
                          const CudaProfileOptions& options, const ProgressCallback& progress = {});

}  // namespace dhelix
