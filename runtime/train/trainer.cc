#include "runtime/train/trainer.h"

#include <fmt/format.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include <unistd.h>

#include <mpi.h>

#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/input_file.h"
#include "lib/job_reader.h"
#include "lib/placement.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"
#include "lib/provenance.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/comm/mpi_wait.h"
#include "runtime/comm/process_groups.h"
#include "runtime/exec/interpreter.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/checkpoint_identity.h"
#include "runtime/train/context_split.h"
#include "runtime/train/memory_record.h"
#include "runtime/train/moe_support.h"
#include "runtime/train/rank_agreement.h"
#include "runtime/train/rank_comms.h"
#include "runtime/train/run_guards.h"
#include "runtime/train/run_trace.h"
#include "runtime/train/token_data.h"
#include "runtime/train/trainer_impl.h"
#include "runtime/train/verification.h"

namespace dhelix::rt {
namespace {

using Clock = std::chrono::steady_clock;

// A training check failed: a --verify difference or a non-finite loss or gradient.
constexpr int kExitTrainingCheckFailed = 1;

// The plan's bytes, for its checksum: a regular file only (lib/input_file.h).
std::string read_bytes(const std::string& path) { return read_input_file(path); }

// The runtime runs dense TP/SP/PP/DP plans (uneven stages on the CPU backend), CP on both backends
// (runtime/model/ layer_ops_cp.h; the CUDA ring kernels: runtime/cuda/ring_attention_cuda.h) and
// MoE with EP on the CPU backend (moe_support.h); the rest waits for its own issue.
void refuse_unsupported(const JobSpec& job, const std::string& plan_file,
                        const std::string& backend) {
  const ParallelSpec& p = job.parallel;
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: dhelix-run does not run {} yet; plan the job without it",
                            plan_file, what));
  };
  refuse_unsupported_moe(job, plan_file, backend);
  // Uneven stages (docs/pipeline.md): each stage builds the layers of its plan's chunks
  // (ModelSlice), and the lowering pairs unequal chunks' SI blocks (lib/plan/rank_program.h).
  // On the CPU backend that is tested (tests/e2e/run_uneven_test.sh); the CUDA engine takes
  // the same slice but has no host test of it yet.
  if (p.uneven_stages() && backend != "cpu") {
    refuse(
        fmt::format("uneven pipeline stages (decoder_first_pipeline_num_layers = {}, "
                    "decoder_last_pipeline_num_layers = {}{}) on the {} backend (cpu only)",
                    p.first_stage_layers, p.last_stage_layers,
                    p.account_for_embedding || p.account_for_loss
                        ? ", or the account_for_embedding/loss_in_pipeline_split flags"
                        : "",
                    backend));
  }
  // The runtime keeps fp32 main gradients; a plan priced with bf16 ones would not match.
  if (p.grad_reduce_in_bf16) refuse("bf16 gradient buffers (grad_reduce_in_bf16)");
  // The layers run every CP communication type on every backend: the K/V ring
  // (runtime/model/layer_ops_cp.h), the K/V all-gather (layer_ops_kv_allgather.h), Ulysses
  // and a2a+p2p (layer_ops_ulysses.h).
  // FSDP's layer gathers and reduce-scatters (runtime/model/fsdp_layers.h) run on both
  // backends, with or without sequence parallelism (the engines sum the norm gains over TP
  // on the shard); the StageModel refuses the rest by name.
}

// The plan's options.fsdp as the model runs it: only optim_grads_params shards the layers
// (ZeRO-3). optim and optim_grads add no ops to the plan and run as the distributed
// optimizer (its sharded moments, and the gradients reduce-scattered at the iteration's end:
// ZeRO-2's sums, though every rank keeps a whole gradient buffer until then).
FsdpSettings fsdp_settings_of(const Plan& plan) {
  const std::optional<PlanFsdpRecord>& fsdp = plan.options.fsdp;
  if (!fsdp || fsdp->sharding_strategy != FsdpShardingStrategy::kOptimGradsParams) return {};
  return {.enabled = true, .reshard_after_forward = fsdp->reshard_after_forward};
}

// "dp 1 x tp 2 x pp 2", with "x cp 2" after tp when cp > 1.
std::string shape_text(const ParallelSpec& p) {
  const std::string cp = p.cp > 1 ? fmt::format(" x cp {}", p.cp) : "";
  return fmt::format("dp {} x tp {}{} x pp {}", p.dp, p.tp, cp, p.pp);
}

TokenSource load_tokens(const TrainOptions& options, const JobSpec& job) {
  if (options.data_file.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "--data: a training data file is required (examples/data/corpus.txt is a "
                "byte-level text corpus)");
  }
  TokenSource source = [&] {
    if (options.data_format == "text") return TokenSource::from_text_file(options.data_file);
    if (options.data_format == "uint16") {
      return TokenSource::from_token_file(options.data_file, TokenWidth::kUint16);
    }
    if (options.data_format == "uint32") {
      return TokenSource::from_token_file(options.data_file, TokenWidth::kUint32);
    }
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("--data-format: '{}' is not one of text, uint16, uint32", options.data_format));
  }();
  source.check_vocab(job.model.vocab_size,
                     fmt::format("{}: /job/model/vocab_size", options.plan_file));
  source.check_sequence_length(job.parallel.seq_length);
  return source;
}

std::string progress_bar(int64_t done, int64_t total) {
  constexpr int64_t kWidth = 20;
  const int64_t filled = total > 0 ? done * kWidth / total : kWidth;
  return "[" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(kWidth - filled), '.') + "]";
}

// With several ranks, a failing op leaves its peers blocked in collectives that will never
// complete: report the error here and end the whole job.
FailureHandler abort_on_failure(int64_t world_size) {
  if (world_size == 1) return {};
  return [](std::exception_ptr failure) {
    int status = exit_status(ErrorCode::kInternal);
    try {
      std::rethrow_exception(failure);
    } catch (const Error& error) {
      status = exit_status(error.code());
      std::cerr << "dhelix-run: error: " << error.what() << std::endl;
    } catch (const std::exception& error) {
      std::cerr << "dhelix-run: internal error: " << error.what() << std::endl;
    }
    abort_world(status);
  };
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// --pin-compute: CPU (rank among the ranks of this host) mod (online CPUs). Collective.
int compute_cpu(bool pin) {
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
            "MPI_Comm_split_type");
  int local_rank = 0;
  check_mpi(MPI_Comm_rank(host, &local_rank), "MPI_Comm_rank");
  MPI_Comm_free(&host);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return pin && cpus > 0 ? static_cast<int>(local_rank % cpus) : -1;
}

}  // namespace

namespace detail {

Trainer::Trainer(const TrainOptions& options, const MpiEnvironment& mpi,
                 const EngineFactory& factory, std::ostream& out)
    : options_(options),
      out_(out),
      rank_(mpi.world_rank()),
      world_size_(mpi.world_size()),
      world_(std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world")) {
  // Reading inputs, lowering the program and building the model are local: any of them
  // may fail on some ranks only, so the ranks agree before their first collective.
  std::exception_ptr failure;
  try {
    read_inputs();
    build_engine(factory);
  } catch (const Error&) {
    failure = std::current_exception();
  }
  agree_on_setup(*world_, failure);
  compute_cpu_ = compute_cpu(options_.pin_compute);
  // Collective on every rank; the emulated link's host check fails on all of them alike.
  const int64_t cp_a2a =
      job_.parallel.cp_comm_type == CpCommType::kA2aP2p ? job_.parallel.cp_a2a_group() : 0;
  agreed([&] {
    groups_ = std::make_unique<ProcessGroups>(*placement_, rank_, link_emulation_, cp_a2a);
  });
  comms_ = std::make_unique<RankComms>(*groups_);
  engine_->connect(*groups_, {&co_executed_, &sequential_});
}

// Everything a rank reads before it talks to the others.
void Trainer::read_inputs() {
  check_run_options(options_);
  const std::optional<MpiWaitMode> wait = parse_mpi_wait_mode(options_.comm_wait);
  if (!wait) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--comm-wait: '{}' is not one of backoff, spin", options_.comm_wait));
  }
  set_mpi_wait_mode(*wait);
  if (options_.comm_max_sleep_us != 0) {
    if (*wait != MpiWaitMode::kBackoff) {
      throw Error(ErrorCode::kInvalidInput,
                  "--comm-max-sleep-us sets the sleeps of --comm-wait backoff; --comm-wait " +
                      options_.comm_wait + " does not sleep");
    }
    if (options_.comm_max_sleep_us < 1) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("--comm-max-sleep-us: {} is not a positive number of microseconds",
                              options_.comm_max_sleep_us));
    }
    set_mpi_max_sleep_us(options_.comm_max_sleep_us);
  }
  link_emulation_ = LinkEmulation::parse(options_.emulate_link);
  if (link_emulation_.enabled() && options_.backend != "cpu") {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("--emulate-link: the {} backend moves its bytes over NCCL; the "
                            "emulated link is the cpu backend's (leave the flag out)",
                            options_.backend));
  }
  if (!options_.trace_file.empty()) {
    if (options_.verify) {
      throw Error(ErrorCode::kInvalidInput,
                  "--trace measures one schedule and --verify runs two: use one of them (add "
                  "--sequential to --trace for the sequential schedule)");
    }
    if (options_.backend != "cpu") {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("--trace: the {} backend does not record op times yet; use "
                              "--backend cpu",
                              options_.backend));
    }
  }
  plan_bytes_ = read_bytes(options_.plan_file);
  plan_ = read_plan(options_.plan_file);
  plan_hash_ = plan_training_sha256(plan_bytes_, options_.plan_file);
  job_ = job_from_plan(plan_, options_.plan_file);
  if (!options_.job_file.empty()) {
    check_plan_matches_job(plan_, options_.plan_file, read_job_file(options_.job_file),
                           options_.job_file);
  }
  refuse_unsupported(job_, options_.plan_file, options_.backend);
  // a2a+p2p's CP sub-groups have no emulated link (runtime/comm/process_groups.h).
  if (link_emulation_.enabled() && job_.parallel.cp_comm_type == CpCommType::kA2aP2p) {
    throw Error(ErrorCode::kUnsupported,
                "--emulate-link: cp_comm_type a2a+p2p's CP sub-groups have no emulated link yet "
                "(leave the flag out)");
  }
  // The whole-world check lowers every rank's program: rank 0 does it for everyone, and the
  // setup agreement below stops every rank when it fails.
  if (options_.check_plan && rank_ == 0)
    require_valid_plan(plan_, options_.plan_file, options_.plan_figures);
  placement_ = std::make_unique<Placement>(job_.parallel, job_.cluster.gpus_per_node);
  if (world_size_ != placement_->world_size()) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("{}: the plan needs {} ranks ({}), mpirun started {}", options_.plan_file,
                    placement_->world_size(), shape_text(job_.parallel), world_size_));
  }
  tokens_ = std::make_unique<TokenSource>(load_tokens(options_, job_));
  coordinates_ = placement_->coordinates(rank_);
}

void Trainer::build_engine(const EngineFactory& factory) {
  const RankProgram program = lower_rank_program(plan_, job_, rank_, ExecutionMode::kCoExecuted);
  co_executed_ = program;
  sequential_ = lower_rank_program(plan_, job_, rank_, ExecutionMode::kSequential);
  const PlanStage* stage = nullptr;
  for (const PlanStage& s : plan_.stages) {
    if (s.stage == program.stage) stage = &s;
  }
  DHELIX_CHECK(stage != nullptr);  // lowering found it
  ModelSlice slice{.layer_ranges = {},
                   .embedding = stage->embedding,
                   .head = stage->head_loss,
                   .seed = options_.seed,
                   .distributed_optimizer = plan_.options.distributed_optimizer,
                   .fsdp = fsdp_settings_of(plan_)};
  for (const PlanLayerRange& range : stage->layer_ranges()) {
    if (range.count > 0) slice.layer_ranges.emplace_back(range.first, range.count);
  }
  head_ = stage->head_loss;
  engine_ = factory(job_, rank_, slice);
}

void Trainer::start_iteration(int64_t step) {
  const ParallelSpec& p = job_.parallel;
  std::vector<MicroBatchTokens> batches(static_cast<size_t>(micro_batches()));
  for (int64_t mb = 0; mb < micro_batches(); ++mb) {
    MicroBatchTokens& batch = batches[static_cast<size_t>(mb)];
    fill_micro_batch(*tokens_, step, coordinates_.dp, p.dp, mb, micro_batches(), p.micro_batch_size,
                     p.seq_length, batch.tokens, batch.targets);
    if (p.cp > 1) {
      batch =
          context_parallel_share(batch, p.micro_batch_size, p.seq_length, p.cp, coordinates_.cp);
    }
  }
  engine_->start_iteration(std::move(batches), 1.0f / static_cast<float>(global_tokens()));
}

double Trainer::iterate(int64_t step, const RankProgram& program, StepRecord* record) {
  start_iteration(step);
  ExecutionOptions execution{.jitter_us = options_.jitter_us,
                             .jitter_seed = static_cast<uint64_t>(step * world_size_ + rank_),
                             .on_failure = abort_on_failure(world_size_),
                             .compute_cpu = compute_cpu_,
                             .timings = record != nullptr ? &record->ops : nullptr};
  if (record != nullptr) record->iteration_start_ns = steady_now_ns();
  const double wall_us = engine_->execute(plan_, program, std::move(execution));
  if (record != nullptr) record->iteration_end_ns = steady_now_ns();
  return wall_us;
}

void Trainer::update(int64_t step, StepRecord* record) {
  if (record != nullptr) record->update_start_ns = steady_now_ns();
  engine_->update(step + 1, options_.adamw);
  if (record != nullptr) {
    record->update_end_ns = steady_now_ns();
    record->sync_end_ns = engine_->last_sync_end_ns();
    record->buckets = engine_->last_bucket_timings();
  }
}

// Runs step `step` both ways; true when every rank matched. Leaves the sequential run's
// gradients (equal to the co-executed ones when true) in the model.
bool Trainer::verify(int64_t step, double& co_executed_us, double& sequential_us) {
  co_executed_us = iterate(step, co_executed_);
  const IterationSnapshot expected = engine_->snapshot();
  sequential_us = iterate(step, sequential_);
  const IterationSnapshot actual = engine_->snapshot();
  const std::optional<std::string> difference = first_difference(expected, actual);
  if (difference) {
    std::cerr << fmt::format(
        "dhelix-run: verify: step {}: rank {}: co-executed vs sequential: {}\n", step + 1, rank_,
        *difference);
  }
  float mismatches = difference ? 1.0f : 0.0f;
  comms_->main_world().all_reduce_sum(&mismatches, 1);
  return mismatches == 0.0f;
}

float Trainer::global_loss() {
  float sum = 0;
  if (coordinates_.tp == 0) {
    for (float loss : engine_->micro_batch_losses()) {
      if (!std::isnan(loss)) sum += loss;
    }
  }
  // MoE: the load-balancing losses (0 otherwise). Under TP each rank's are those of its
  // sequence-parallel rows, and the objective takes their mean (moe_layers_cpu.h).
  const float aux = engine_->moe_aux_loss_sum();
  if (aux != 0.0f) sum += job_.parallel.tp > 1 ? aux / static_cast<float>(job_.parallel.tp) : aux;
  comms_->main_world().all_reduce_sum(&sum, 1);
  // Each CP rank's loss is the mean over its equal share of the tokens.
  return sum / static_cast<float>(micro_batches() * job_.parallel.dp * job_.parallel.cp);
}

void Trainer::report(int64_t step, float loss, double step_seconds) {
  if (rank_ != 0) return;
  if (options_.progress) {
    out_ << fmt::format("step {:>4}/{}  loss {:.4f}  {:>9.0f} tokens/s  {:.3f} s  {}\n", step + 1,
                        options_.steps, loss, static_cast<double>(global_tokens()) / step_seconds,
                        step_seconds, progress_bar(step + 1, options_.steps));
    out_.flush();
  }
  if (loss_log_.is_open()) {
    loss_log_.append(
        fmt::format("{{\"step\": {}, \"loss\": {:.9g}, \"loss_bits\": \"0x{:08x}\"}}\n", step + 1,
                    loss, std::bit_cast<uint32_t>(loss)));
  }
}

// Take the checkpoint directory, resume and open the loss log: a failure on any rank stops
// every rank, reported once.
int64_t Trainer::start_training() {
  if (!options_.checkpoint_dir.empty()) take_checkpoint_dir();
  const int64_t first_step = options_.resume ? restore_checkpoint() : 0;
  agreed([&] {
    if (rank_ == 0 && !options_.loss_log.empty()) {
      loss_log_.open(options_.loss_log);
    }
  });
  return first_step;
}

// Collective: every rank's memory (runtime/train/memory_record.h), at rank 0.
std::vector<RankMemory> Trainer::gather_memory() {
  return gather_rank_memory(rank_, co_executed_.stage, engine_->memory_report());
}

// Rank 0's last line: what the run did.
void Trainer::print_summary(int64_t first_step, double seconds, float loss) const {
  if (rank_ != 0) return;
  const int64_t steps = options_.steps - first_step;
  const std::string checkpoint =
      options_.checkpoint_dir.empty()
          ? "no checkpoint written (no --checkpoint-dir)"
          : fmt::format("checkpoint {} written", step_dir(options_.checkpoint_dir, options_.steps));
  // A run on an emulated link says so: its speed is the modelled link's, not a network's.
  // It also says whether rank 0's calls returned when their links were done
  // (runtime/comm/emulated_link.h, "Late returns").
  const std::string link =
      link_emulation_.enabled()
          ? fmt::format(", on an emulated link ({}; rank 0: {})", link_emulation_.describe(),
                        lateness_text(groups_->link_lateness()))
          : "";
  out_ << fmt::format(
      "dhelix-run: done: {} step{} ({}..{}) in {:.2f} s, {:.0f} tokens/s{}, final loss {:.4f}, "
      "{}\n",
      steps, steps == 1 ? "" : "s", first_step + 1, options_.steps, seconds,
      seconds > 0 ? static_cast<double>(steps * global_tokens()) / seconds : 0.0, link, loss,
      checkpoint);
  out_.flush();
}

int Trainer::run() {
  const StopSignals signals;
  const int64_t first_step = start_training();
  const Clock::time_point started = Clock::now();
  float loss = std::nanf("");
  if (rank_ == 0) {
    out_ << fmt::format(
        "dhelix-run: {} on {} ranks ({}, {} backend), {} micro-batches of {} "
        "x {} tokens, {} schedule, steps {}..{}\n",
        job_.name, world_size_, shape_text(job_.parallel), options_.backend, micro_batches(),
        job_.parallel.micro_batch_size, job_.parallel.seq_length,
        options_.sequential ? "sequential" : "co-executed (plan)", first_step + 1, options_.steps);
  }
  // Collective (a barrier): every rank builds it or none does.
  std::unique_ptr<RunTrace> trace;
  if (!options_.trace_file.empty()) {
    trace = std::make_unique<RunTrace>(
        options_.sequential ? ExecutionMode::kSequential : ExecutionMode::kCoExecuted, rank_);
  }
  for (int64_t step = first_step; step < options_.steps; ++step) {
    const Clock::time_point start = Clock::now();
    StepRecord* record = trace ? &trace->add_step(step) : nullptr;
    if (options_.verify) {
      double co_us = 0;
      double seq_us = 0;
      if (!verify(step, co_us, seq_us)) return kExitTrainingCheckFailed;
      if (rank_ == 0) {
        out_ << fmt::format(
            "verify step {}: co-executed and sequential schedules bitwise equal on {} ranks "
            "({} micro-batch losses, every gradient; {:.1f} ms vs {:.1f} ms)\n",
            step + 1, world_size_, micro_batches(), co_us / 1000, seq_us / 1000);
      }
    } else {
      iterate(step, options_.sequential ? sequential_ : co_executed_, record);
    }
    // Before the update: a diverged step leaves the model and checkpoints as they were.
    if (stop_if_not_finite(step)) return kExitTrainingCheckFailed;
    update(step, record);
    loss = global_loss();
    report(step, loss, std::chrono::duration<double>(Clock::now() - start).count());
    const bool last = step + 1 == options_.steps;
    const bool due = options_.checkpoint_every > 0 && (step + 1) % options_.checkpoint_every == 0;
    const bool checkpoint = !options_.checkpoint_dir.empty() && (last || due);
    if (checkpoint) {
      const std::vector<NamedTensor> state = engine_->state();
      if (!state_is_finite(step + 1, state)) return kExitTrainingCheckFailed;
      save_checkpoint(step + 1, state);
    }
    if (!last) {
      if (const int status = stop_for_signal(step + 1, checkpoint); status != 0) return status;
    }
  }
  // Written only after the last step: every rank reaches this point together.
  const std::vector<RankMemory> memory = gather_memory();
  if (trace) {
    trace->set_memory(memory);
    if (link_emulation_.enabled()) {
      OrderedJson links = link_emulation_.to_json();
      links["rank0_returns"] = lateness_to_json(groups_->link_lateness());
      trace->set_link_emulation(std::move(links));
    }
    trace->write(options_.trace_file, plan_, job_);
    if (rank_ == 0) out_ << fmt::format("dhelix-run: wrote {}\n", options_.trace_file);
  }
  if (rank_ == 0) out_ << memory_report_lines(memory);
  print_summary(first_step, std::chrono::duration<double>(Clock::now() - started).count(), loss);
  return 0;
}

}  // namespace detail

int run_training(const TrainOptions& options, const MpiEnvironment& mpi,
                 const EngineFactory& factory, std::ostream& out) {
  detail::Trainer trainer(options, mpi, factory, out);
  return trainer.run();
}

}  // namespace dhelix::rt
