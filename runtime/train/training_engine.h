#pragma once
// What the training loop (runtime/train/trainer.cc) needs from a backend: a model slice,
// a way to run one iteration of a rank program on it, the optimizer step and host copies
// of the state for checkpoints and --verify. The loop itself (data, steps, losses,
// checkpoints, verify) is the same for every backend.
//
//   CpuEngine  (runtime/train/cpu_engine.h): StageModel, the plan interpreter over CPU
//              streams, MPI collectives, AdamW on the host.
//   CudaEngine (runtime/cuda/cuda_engine.h): the same model on the CUDA backend, the device
//              executor over CUDA streams, NCCL collectives, AdamW on the device.
//
// Two phases, because the ranks must agree that every one of them could start before any
// collective call (runtime/train/trainer.cc, agree_on_setup): an engine is made by its
// factory with only local work (reading, allocating, building the model), and connect()
// then does the collective part (communicators).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/comm/process_groups.h"
#include "runtime/exec/interpreter.h"
#include "runtime/memory/memory_report.h"
#include "runtime/model/stage_model.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/gradient_reduction.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/verification.h"

namespace dhelix::rt {

/// Which slice of the model a rank holds (from its plan stage).
struct ModelSlice {
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;  ///< (first layer, count) per chunk
  bool embedding = false;
  bool head = false;
  uint64_t seed = 0;
  /// The plan's options.distributed_optimizer: AdamW state sharded over the data-parallel
  /// replicas (runtime/train/sharded_adamw.h; the CPU engine).
  bool distributed_optimizer = false;
  /// The plan's options.fsdp: the layers sharded over DP (runtime/model/fsdp_layers.h; the
  /// CPU engine).
  FsdpSettings fsdp;
};

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  /// The collective part of setup, over every rank's process groups. `programs` are the
  /// programs this rank will execute (both modes), for communicators they need.
  virtual void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) = 0;
  /// Zeroes gradients, sets the loss scale and gives every micro-batch its tokens.
  virtual void start_iteration(std::vector<MicroBatchTokens> micro_batches, float loss_scale) = 0;
  /// Runs `program` once; returns the iteration's wall time in microseconds.
  virtual double execute(const Plan& plan, const RankProgram& program,
                         ExecutionOptions options) = 0;
  /// Per micro-batch mean losses of the last iteration (NaN where not computed here).
  virtual std::vector<float> micro_batch_losses() = 0;
  /// MoE: the sum of this rank's load-balancing losses of the last iteration over its
  /// layers and micro-batches (runtime/model/moe_layers_cpu.h); 0 without MoE layers.
  virtual float moe_aux_loss_sum() { return 0.0f; }
  /// Losses and gradients, on the host: local (before synchronisation), or already summed
  /// where the reduction overlapped the execution.
  virtual IterationSnapshot snapshot() = 0;
  /// Whether every gradient (as snapshot() sees it) is finite, tested where the
  /// gradients live (kernels/finite_check.h): on a GPU one flag comes back, not the
  /// gradients. The training loop asks every step; snapshot() only names the culprit.
  virtual bool gradients_finite() = 0;
  /// Sums gradients over TP (where asked) and DP (or waits for the sums that overlapped the
  /// backward), then applies AdamW step t (1-based).
  virtual void update(int64_t t, const AdamWSettings& settings) = 0;
  /// When the last update()'s gradient sums ended and AdamW began, steady_clock ns (0: the
  /// engine does not tell; dhelix-run --trace then shows one "update" slice).
  virtual int64_t last_sync_end_ns() const { return 0; }
  /// Each gradient bucket's reduction in the last iteration (empty: the engine does not
  /// tell; runtime/train/gradient_reduction.h), for dhelix-run --trace.
  virtual std::vector<BucketTiming> last_bucket_timings() const { return {}; }
  /// What this rank's memory holds (runtime/memory/memory_report.h), once connect() has
  /// laid out the activation arena.
  virtual MemoryReport memory_report() = 0;
  /// Host copies of every tensor a checkpoint holds: each parameter by name, then its
  /// AdamW moments as "adam_m/<name>" and "adam_v/<name>".
  virtual std::vector<NamedTensor> state() = 0;
  /// Loads every tensor of state() from `shard` (Error(kInvalidInput) naming the file when
  /// one is missing or has another size).
  virtual void restore(const RankShard& shard) = 0;
};

/// Makes a rank's engine (local work only; see the file comment).
using EngineFactory = std::function<std::unique_ptr<TrainingEngine>(
    const JobSpec& job, int64_t rank, const ModelSlice& slice)>;

}  // namespace dhelix::rt
