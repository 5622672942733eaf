#pragma once
// Turns an Op into an enqueue-able closure on device buffers it owns (the launch chosen by
// cuda_op_plan.h), and owns the NCCL communicators the job's collectives run on.
//
// Communicators: for every process-group dimension the profile's collectives use, every
// rank joins the NCCL communicator of its own group (Placement, lib/placement.h), twice:
// strand 0 and strand 1, so that two collectives of one pair (a self-pair runs the same op
// on both streams) never share a communicator, which NCCL would serialise. Each is
// bootstrapped over MPI: MPI_Comm_split by group, ncclGetUniqueId on the group's first
// member, MPI_Bcast, ncclCommInitRank. All ranks make them in the same order
// (nccl_group_setups, cuda_setup.h), so that no NCCL initialisation waits on another.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "lib/op_catalogue.h"
#include "lib/placement.h"
#include "profiler/cuda/cuda_op_plan.h"
#include "profiler/cuda/cuda_timer.h"
#include "runtime/cuda/attention_path.h"
#include "runtime/cuda/cudnn_sdpa.h"

namespace dhelix::cuda_profile {

/// A measurable op: `enqueue` launches it once on a stream; the buffers it uses live as
/// long as the closure.
struct CudaRunnableOp {
  Enqueue enqueue;
  OpLaunchPlan plan;
};

class CudaOpRunner {
 public:
  /// Collective over MPI_COMM_WORLD (every rank passes the same dims): makes the cuBLAS
  /// handle and the communicators of `dims` for world rank `rank` (see the file comment).
  CudaOpRunner(const Placement& placement, const std::vector<ParallelDim>& dims, int64_t rank,
               MPI_Comm world);
  ~CudaOpRunner();
  CudaOpRunner(const CudaOpRunner&) = delete;
  CudaOpRunner& operator=(const CudaOpRunner&) = delete;

  /// The closure for `op`; collectives run on this rank's communicator of the op's group
  /// and `strand` (0 or 1). Allocates and fills the buffers now (synchronously).
  CudaRunnableOp make(const Op& op, int strand);

 private:
  ncclComm_t communicator(ParallelDim dim, int strand) const;
  // cuDNN's attention when dhelix-run's decision (attention_path.h) picks it for this shape,
  // else nullptr (dhelix's kernels); decided once per shape, said once on rank 0.
  cuda::CudnnSdpa* attention_for(const AttentionLaunch& attention);
  // Destroys the communicators and the cuBLAS handle made so far.
  void release() noexcept;

  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;  // the runtime's workspace size (cublas_gemm.h)
  std::map<ParallelDim, std::array<ncclComm_t, 2>> comms_;
  uint64_t next_seed_ = 1;
  int64_t rank_ = 0;
  std::unique_ptr<cuda::CudnnSdpa> sdpa_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, cuda::AttentionPath>
      attention_paths_;
};

}  // namespace dhelix::cuda_profile
