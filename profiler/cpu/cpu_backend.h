#pragma once
// The measuring `cpu` profiler backend: times the CPU runtime's own kernels
// (runtime/cpu/kernels_cpu.h) and MPI collectives (runtime/comm/) for every op signature of
// a job's profile space (collect_profile_space, model_backend.h), alone and in the pairs
// the planner may overlap, and returns a profile of the same shape as the model backend's
// with backend "cpu".
//
// It runs on every rank of an MPI job (mpirun -np R dhelix-profile --backend cpu ...), R
// being the largest group among the job's communication ops (2 for a tp-2 job): every
// collective needs all its members. All ranks walk the same job-derived list of ops and
// pairs in the same order, start every sample together after a barrier and run the same
// kernel at the same time (as the ranks of a training run do); the profile holds rank 0's
// times.
//
// Solo: warm-up runs, then N samples (cpu_timing.h), ops that read parameters on operands
// out of the caches (cold_operands.h). Pair (a, b): the compute op (or a,
// when both communicate) on the calling thread and the other on a helper thread, started
// together, the shorter op repeated for as long as the longer one lasts (as a run keeps
// its compute stream busy beside a collective; cpu_timing.h), and each sample turned into
// one op of each; the finish times' medians, and the OEF from them and the solo medians
// (lib/profile.h). Profiles hold OEFs in [-1, 1] only: a co-run slower than that (possible
// when busy-polling MPI threads crowd a small machine) is capped at -1 and counted in the
// profile's meta.measurement.
//
// With CpuProfileOptions::link_emulation enabled, each collective runs on the emulated link
// of its group kind (runtime/comm/emulated_link.h), as dhelix-run --emulate-link runs it,
// and meta.measurement.link_emulation records the links.

#include <cstdint>

#include "lib/job_spec.h"
#include "lib/json_reader.h"
#include "lib/profile.h"
#include "profiler/cpu/cpu_timing.h"
#include "profiler/model_backend.h"
#include "runtime/comm/link_emulation.h"

namespace dhelix {

/// How the cpu backend measures, and where this process stands in the MPI job.
struct CpuProfileOptions {
  cpu_profile::TimingOptions timing;
  int blas_threads = 1;  ///< OpenBLAS threads per rank (cpu::set_blas_threads)
  /// Ops that read parameters cycle through copies of their buffers exceeding this many
  /// bytes, so that every run finds its weights out of the caches as a training step does
  /// (profiler/cpu/cold_operands.h); 0: one set of buffers, timed hot.
  int64_t cold_operand_bytes = 0;
  int64_t world_rank = 0;  ///< this process's rank in MPI_COMM_WORLD
  int64_t world_size = 1;  ///< ranks in MPI_COMM_WORLD
  /// --emulate-link: collectives complete on modelled links (runtime/comm/emulated_link.h)
  rt::LinkEmulation link_emulation;
};

/// Ranks the cpu backend needs for `space`: the largest group size among its communication
/// ops, 1 when it has none.
int64_t cpu_ranks_needed(const ProfileSpace& space);

/// Throws Error(kInvalidInput) unless world_size is a positive multiple of
/// cpu_ranks_needed(space): "the cpu backend measures tp-2 collectives with 2 ranks: run
/// mpirun -np 2 dhelix-profile ..., or a multiple of 2 (this run has 3 ranks)". With a
/// multiple, every group of that many ranks measures at once (the host as busy as in a run
/// with as many ranks); the profile holds rank 0's times.
void check_cpu_world_size(const ProfileSpace& space, int64_t world_size);

/// Measures the profile of `job`. Collective over MPI_COMM_WORLD, which must be initialised
/// with MPI_THREAD_MULTIPLE and have the size check_cpu_world_size accepts (checked first,
/// on every rank alike). `meta` is stored with a "measurement" object added (backend,
/// ranks, samples, host CPU, MPI library, pairs adjusted). Progress is reported on every
/// rank that passes a callback.
Profile make_cpu_profile(const JobSpec& job, const OrderedJson& meta,
                         const CpuProfileOptions& options, const ProgressCallback& progress = {});

}  // namespace dhelix
