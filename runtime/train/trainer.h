#pragma once
// dhelix-run's training loop on one rank: read the plan, build the rank's program and model
// slice, then per step: fill the micro-batches, execute the program, synchronise
// gradients, apply AdamW, report the loss and checkpoint. With --verify each step also runs
// the sequential schedule and demands bitwise-equal losses and gradients.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_check.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/setup_failure.h"
#include "runtime/train/training_engine.h"

namespace dhelix::rt {

class MpiEnvironment;

struct TrainOptions {
  std::string plan_file;
  std::string job_file;              ///< optional: refuse the plan unless it was made for this job
  int64_t steps = 10;                ///< steps to run (in all, counting those a resume skips)
  std::string data_file;             ///< training tokens
  std::string data_format = "text";  ///< "text" (bytes), "uint16", "uint32"
  std::string checkpoint_dir;        ///< "" = no checkpoints
  int64_t checkpoint_every = 0;      ///< steps between checkpoints; 0 = only at the end
  bool resume = false;               ///< continue from checkpoint_dir's latest checkpoint
  uint64_t seed = 1234;              ///< weight initialisation
  AdamWSettings adamw;
  bool verify = false;          ///< also run the sequential schedule and compare bitwise
  bool sequential = false;      ///< train with the sequential schedule instead of the plan's
  bool check_plan = true;       ///< run the plan checker (lib/plan/plan_check.h) before training
  int64_t jitter_us = 0;        ///< random delay before each op (runtime/exec/jitter.h)
  std::string backend = "cpu";  ///< "cpu" or "cuda" (which engine the factory makes)
  /// Elements per data-parallel gradient bucket (runtime/train/gradient_buckets.h); 0: the
  /// planner's, megatron_dp_bucket_parameters(dp x cp) (dhelix-run resolves it).
  int64_t ddp_bucket_size = 0;
  /// --overlap-grad-reduce / --no-overlap-grad-reduce; unset: the plan's
  /// parallel.overlap_grad_reduce (cpu backend; runtime/train/gradient_reduction.h).
  std::optional<bool> overlap_grad_reduce;
  /// --distributed-optimizer / --no-distributed-optimizer; unset: the plan's
  /// options.distributed_optimizer (cpu backend; runtime/train/sharded_adamw.h).
  std::optional<bool> distributed_optimizer;
  /// --overlap-param-gather / --no-overlap-param-gather; unset: the plan's
  /// parallel.overlap_param_gather (cpu backend, distributed optimizer).
  std::optional<bool> overlap_param_gather;
  int blas_threads = 1;  ///< OpenBLAS threads of the CPU backend
  std::string loss_log;  ///< "" or a file receiving one JSON line per step (rank 0)
  bool progress = true;  ///< print a line per step (rank 0)
  /// "" or the Chrome trace file of every rank's measured timeline (runtime/train/run_trace.h)
  std::string trace_file;
  std::string comm_wait =
      "backoff";  ///< how MPI waits: "backoff" or "spin" (runtime/comm/mpi_wait.h)
  /// Longest sleep between two MPI tests with backoff, us; 0: mpi_wait.h's default
  int64_t comm_max_sleep_us = 0;
  bool pin_compute = false;  ///< pin each rank's compute stream (runtime/exec/affinity.h)
  /// --emulate-link values (runtime/comm/link_emulation.h); empty: the real transport
  std::vector<std::string> emulate_link;
  /// The checker's memory recomputation (planner/plan_figures_check.h; dhelix-run binds it).
  PlanFiguresCheck plan_figures;
};

/// Trains as `options` say on the engines `factory` makes. Returns the exit status, the
/// same on every rank: 0; 1 when --verify found a difference or a loss or gradient was not
/// finite (printed; runtime/train/run_guards.h); 128 + N when signal N (SIGINT, SIGTERM)
/// stopped the run after a step, with a checkpoint written. Throws SetupFailure when any rank's
/// setup failed (all ranks throw it), and dhelix::Error for a failure during training (on that rank
/// only).
int run_training(const TrainOptions& options, const MpiEnvironment& mpi,
                 const EngineFactory& factory, std::ostream& out);

}  // namespace dhelix::rt
