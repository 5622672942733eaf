#pragma once
// The Trainer behind run_training (trainer.h): one rank's training run, from reading the
// plan to the last checkpoint. Its members live in two files: trainer.cc (set-up, the step
// loop, --verify, reports) and trainer_stops.cc (the ways a run stops early, non-finite
// values and signals, and the checkpoints they write or read). Internal to the runtime:
// only run_training constructs one.

#include <cstdint>
#include <exception>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "lib/append_file.h"
#include "lib/error.h"
#include "lib/job_spec.h"
#include "lib/placement.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/comm/process_groups.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/checkpoint_lock.h"
#include "runtime/train/memory_record.h"
#include "runtime/train/rank_agreement.h"
#include "runtime/train/rank_comms.h"
#include "runtime/train/run_trace.h"
#include "runtime/train/setup_failure.h"
#include "runtime/train/token_data.h"
#include "runtime/train/trainer.h"
#include "runtime/train/training_engine.h"

namespace dhelix::rt::detail {

class Trainer {
 public:
  Trainer(const TrainOptions& options, const MpiEnvironment& mpi, const EngineFactory& factory,
          std::ostream& out);

  int run();

 private:
  void read_inputs();
  template <typename Work>
  void agreed(Work work);
  int64_t start_training();
  void print_summary(int64_t first_step, double seconds, float loss) const;
  std::vector<RankMemory> gather_memory();
  void build_engine(const EngineFactory& factory);
  int64_t micro_batches() const { return plan_.num_micro_batches; }
  int64_t global_tokens() const {
    const ParallelSpec& p = job_.parallel;
    return micro_batches() * p.micro_batch_size * p.seq_length * p.dp;
  }
  void start_iteration(int64_t step);
  double iterate(int64_t step, const RankProgram& program, StepRecord* record = nullptr);
  void update(int64_t step, StepRecord* record);
  bool verify(int64_t step, double& co_executed_us, double& sequential_us);
  float global_loss();
  bool stop_if_not_finite(int64_t step);
  int stop_for_signal(int64_t completed_steps, bool checkpointed);
  void report(int64_t step, float loss, double step_seconds);
  void save_checkpoint(int64_t completed_steps, const std::vector<NamedTensor>& state);
  bool state_is_finite(int64_t completed_steps, const std::vector<NamedTensor>& state);
  std::string set_aside_diverged_checkpoint(int64_t bad_step);
  void take_checkpoint_dir();
  ShardIdentity identity() const;
  int64_t restore_checkpoint();

  const TrainOptions& options_;
  std::ostream& out_;
  int64_t rank_;
  int64_t world_size_;
  // MPI_COMM_WORLD, for the agreements of rank_agreement.h on the main thread (the process
  // groups do not exist yet at the first one).
  std::unique_ptr<Communicator> world_;
  std::string plan_bytes_;
  std::string plan_hash_;  // plan_training_sha256: what checkpoints are checked against
  std::string run_id_;     // with --checkpoint-dir: rank 0's, shared (checkpoint_identity.h)
  std::unique_ptr<CheckpointLock> lock_;  // rank 0, with --checkpoint-dir
  Plan plan_;
  JobSpec job_;
  std::unique_ptr<Placement> placement_;
  RankCoordinates coordinates_;
  std::unique_ptr<TokenSource> tokens_;
  LinkEmulation link_emulation_;  // --emulate-link
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<RankComms> comms_;
  std::unique_ptr<TrainingEngine> engine_;
  RankProgram co_executed_;
  RankProgram sequential_;
  int compute_cpu_ = -1;  // --pin-compute
  bool head_ = false;     // this rank's stage computes the loss of every micro-batch
  // Rank 0's --loss-log, opened once: a FIFO reader sees one stream, not one per step.
  AppendFile loss_log_;  // --loss-log (lib/append_file.h: a FIFO nobody reads cannot hang it)
};

// `work`, local to this rank; then every rank learns whether any rank's work failed.
template <typename Work>
void Trainer::agreed(Work work) {
  std::exception_ptr failure;
  try {
    work();
  } catch (const SetupFailure&) {
    throw;  // agreed already
  } catch (const Error&) {
    failure = std::current_exception();
  }
  agree_on_setup(*world_, failure);
}

}  // namespace dhelix::rt::detail
