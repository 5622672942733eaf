#pragma once
// The CPU backend's training engine (runtime/train/training_engine.h): StageModel in host
// memory, the plan interpreter (runtime/exec/interpreter.h) over MPI communicators, and
// AdamW on the host. The data-parallel gradient sums run in buckets on a thread of their
// own, overlapped with the backward when the job asks for it (gradient_reduction.h); with
// the distributed optimizer they are reduce-scattered and AdamW steps this rank's shard
// (sharded_adamw.h).

#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/train/training_engine.h"

namespace dhelix::rt {

struct CpuEngineOptions {
  int blas_threads = 1;  ///< OpenBLAS's thread count for the process
  /// Elements per data-parallel gradient bucket (--ddp-bucket-size; >= 1).
  int64_t ddp_bucket_elements = 40'000'000;
  /// --overlap-grad-reduce / --no-overlap-grad-reduce; unset: the job's
  /// parallel.overlap_grad_reduce.
  std::optional<bool> overlap_grad_reduce;
  /// --distributed-optimizer / --no-distributed-optimizer; unset: the plan's
  /// options.distributed_optimizer (ModelSlice).
  std::optional<bool> distributed_optimizer;
  /// --overlap-param-gather / --no-overlap-param-gather; unset: the job's
  /// parallel.overlap_param_gather (with the distributed optimizer only).
  std::optional<bool> overlap_param_gather;
};

/// The CPU engine's factory.
EngineFactory cpu_engine_factory(CpuEngineOptions options);

}  // namespace dhelix::rt
