// dhelix-run: trains with a plan on MPI ranks (runtime/train/trainer.h).
//
//   mpirun -np 4 dhelix-run --plan plan.json --data examples/data/corpus.txt --steps 20
//   mpirun -np 4 dhelix-run --plan plan.json --data corpus.txt --verify
//   mpirun -np 8 dhelix-run --backend cuda --plan plan.json --data corpus.txt   (one GPU a rank)
//
// MPI is initialised before the command line is parsed (mpirun may add arguments of its
// own, which MPI_Init removes); with --backend cuda, the environment CUDA reads when it
// starts is set before that (tools/cuda_start.h). Every message is printed once, not once per rank:
// rank 0 alone prints --help and command-line errors (every rank parses the same line); a failure
// the ranks agree on (setup, resume, a checkpoint write: runtime/train/setup_failure.h) is
// printed by the first rank that failed and ends every rank normally, with its status. Any
// other error with several ranks ends the whole job (MPI_Abort, and OpenMPI's notice): the
// other ranks may be waiting for this one in a collective. Rank 0 ends a finished run with
// one summary line (steps, tokens/s, final loss, time, checkpoint).

#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>

#include "lib/error.h"
#include "planner/dp_overlap.h"
#include "planner/plan_figures_check.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/train/cpu_engine.h"
#include "runtime/train/trainer.h"
#include "tools/cuda_start.h"
#include "tools/option_values.h"
#include "tools/tool_main.h"
#ifdef DHELIX_WITH_CUDA
#include "runtime/cuda/cuda_engine.h"
#include "runtime/cuda/cuda_environment.h"
#endif

namespace {

using dhelix::add_integer_option;
using dhelix::add_uint64_option;

// --steps and --checkpoint-every: at most 2^40 steps.
constexpr dhelix::IntRange kStepRange = {.min = 1, .max = int64_t{1} << 40};
// --watchdog-s: a second to a day.
constexpr dhelix::IntRange kWatchdogRange = {.min = 1, .max = 86400};
// The CUDA engine's watchdog default (runtime/cuda/nccl_communicator.h says why 300 s); the
// same number in a build without CUDA, so that --help reads the same.
constexpr int64_t kDefaultWatchdogS = 300;

// Flags of the cuda backend that TrainOptions does not carry.
struct CudaFlags {
  std::optional<int64_t> watchdog_s;  // --watchdog-s; unset: kDefaultWatchdogS
};

// --watchdog-s watches CUDA streams and NCCL communicators: refused with the cpu backend
// (whose ranks wait in MPI) rather than silently ignored. A command-line error, printed once.
void check_cuda_flags(const dhelix::rt::TrainOptions& options, const CudaFlags& cuda) {
  if (cuda.watchdog_s && options.backend != "cuda") {
    throw CLI::ValidationError(
        fmt::format("--watchdog-s {}: the watchdog watches CUDA streams "
                    "and NCCL communicators; it needs --backend cuda (the "
                    "backend is {})",
                    *cuda.watchdog_s, options.backend));
  }
}

// --ddp-bucket-size, else the planner's bucket for the job's DP x CP group (Megatron-Core's
// default, planner/dp_overlap.h): the runtime reduces in the buckets the plan assumed.
int64_t bucket_elements(int64_t ddp_bucket_size, const dhelix::JobSpec& job) {
  if (ddp_bucket_size > 0) return ddp_bucket_size;
  return dhelix::megatron_dp_bucket_parameters(job.parallel.dp * job.parallel.cp);
}

dhelix::rt::EngineFactory engine_factory(const dhelix::rt::TrainOptions& options,
                                         const CudaFlags& cuda) {
  const int64_t bucket_size = options.ddp_bucket_size;
  const std::optional<bool> overlap = options.overlap_grad_reduce;
  const std::optional<bool> distributed = options.distributed_optimizer;
  const std::optional<bool> gather = options.overlap_param_gather;
  if (options.backend == "cpu") {
    const int blas_threads = options.blas_threads;
    return [=](const dhelix::JobSpec& job, int64_t rank, const dhelix::rt::ModelSlice& slice) {
      return dhelix::rt::cpu_engine_factory(
          {.blas_threads = blas_threads,
           .ddp_bucket_elements = bucket_elements(bucket_size, job),
           .overlap_grad_reduce = overlap,
           .distributed_optimizer = distributed,
           .overlap_param_gather = gather})(job, rank, slice);
    };
  }
#ifdef DHELIX_WITH_CUDA
  const bool deterministic = options.verify;
  const auto watchdog_s = static_cast<double>(cuda.watchdog_s.value_or(kDefaultWatchdogS));
  static_assert(kDefaultWatchdogS == dhelix::cuda::kDefaultWatchdogSeconds);
  return [=](const dhelix::JobSpec& job, int64_t rank, const dhelix::rt::ModelSlice& slice) {
    return dhelix::cuda::cuda_engine_factory(
        {.ddp_bucket_elements = bucket_elements(bucket_size, job),
         .deterministic = deterministic,
         .overlap_grad_reduce = overlap,
         .distributed_optimizer = distributed,
         .overlap_param_gather = gather,
         .watchdog_s = watchdog_s})(job, rank, slice);
  };
#else
  static_cast<void>(cuda);
  // Thrown when the engine is made, inside the ranks' setup agreement: every rank stops
  // with this message instead of aborting the job.
  return [](const dhelix::JobSpec&, int64_t,
            const dhelix::rt::ModelSlice&) -> std::unique_ptr<dhelix::rt::TrainingEngine> {
    throw dhelix::Error(dhelix::ErrorCode::kUnsupported,
                        "--backend cuda: this dhelix-run was built without CUDA (the CUDA "
                        "toolkit was not found when it was configured; see docs/gpu.md)");
  };
#endif
}

void add_options(CLI::App& app, dhelix::rt::TrainOptions& o, CudaFlags& cuda) {
  app.add_option("--plan", o.plan_file, "Plan file written by dhelix-plan")->required();
  app.add_option("--job", o.job_file, "Job file: refuse the plan unless it was made for this job");
  app.add_option("--data", o.data_file, "Training data (examples/data/corpus.txt)")->required();
  app.add_option("--data-format", o.data_format, "text (bytes), uint16 or uint32 token ids")
      ->capture_default_str();
  add_integer_option(app, "--steps", o.steps, kStepRange, "Training steps in all");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Directory of checkpoints")
      ->type_name("DIR");
  add_integer_option(app, "--checkpoint-every", o.checkpoint_every,
                     {.min = 0, .max = kStepRange.max},
                     "Steps between checkpoints (0: only after the last step)");
  app.add_flag("--resume", o.resume, "Continue from the latest checkpoint of --checkpoint-dir");
  add_uint64_option(app, "--seed", o.seed, "Seed of the weight initialisation");
  app.add_option("--lr", o.adamw.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  app.add_flag("--verify", o.verify,
               "Also run every step with the sequential schedule and require bitwise-equal "
               "losses and gradients");
  app.add_flag("--sequential", o.sequential,
               "Train with the sequential schedule instead of the plan's co-execution");
  app.add_flag("!--no-check", o.check_plan,
               "Skip the plan checker (dhelix-plan --check) that runs before training");
  add_integer_option(app, "--jitter-us", o.jitter_us, {.min = 0, .max = 1000000},
                     "Sleep a random 0..N us before every op: shakes the streams' timing so "
                     "that --verify exposes a missing dependency");
  app.add_option("--backend", o.backend,
                 "cpu: MPI ranks on the host; cuda: one GPU per rank, NCCL (docs/gpu.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_integer_option(app, "--watchdog-s", cuda.watchdog_s, kWatchdogRange,
                     "Seconds any wait for the GPU (the NCCL warm-up, an iteration's enqueueing "
                     "and its end) may last before the rank names the busy streams, their last "
                     "instruction and their NCCL communicators, and fails (cuda backend; "
                     "default 300: 10x a long iteration, half of ctest's timeout; docs/gpu.md)");
  app.final_callback([&o, &cuda] { check_cuda_flags(o, cuda); });
  add_integer_option(app, "--ddp-bucket-size", o.ddp_bucket_size,
                     {.min = 1, .max = int64_t{1} << 40},
                     "Elements per data-parallel gradient bucket, one all-reduce each (as "
                     "Megatron-LM's --ddp-bucket-size; default the planner's, max(40M, 1M x dp "
                     "x cp))");
  app.add_flag_function(
      "--overlap-grad-reduce,!--no-overlap-grad-reduce",
      [&o](int64_t count) { o.overlap_grad_reduce = count > 0; },
      "Sum each gradient bucket as soon as the backward has finished it, while the backward "
      "goes on (default: the plan's parallel.overlap_grad_reduce); --no-...: "
      "after the iteration");
  app.add_flag_function(
      "--distributed-optimizer,!--no-distributed-optimizer",
      [&o](int64_t count) { o.distributed_optimizer = count > 0; },
      "Shard the AdamW state over the data-parallel replicas: reduce-scatter the gradients, "
      "step this rank's shard, all-gather the weights (default: the plan's "
      "options.distributed_optimizer); --no-...: every replica steps every weight");
  app.add_flag_function(
      "--overlap-param-gather,!--no-overlap-param-gather",
      [&o](int64_t count) { o.overlap_param_gather = count > 0; },
      "With the distributed optimizer, all-gather the updated weights bucket by bucket while "
      "the next iteration's forward starts (default: the plan's "
      "parallel.overlap_param_gather); --no-...: in the optimizer step");
  add_integer_option(app, "--blas-threads", o.blas_threads, {.min = 1, .max = 256},
                     "OpenBLAS threads per rank (cpu backend)");
  app.add_option("--loss-log", o.loss_log,
                 "Append one JSON line per step (rank 0) to a new file or an existing loss log");
  app.add_flag("!--no-progress", o.progress, "Do not print a line per step");
  app.add_option("--trace", o.trace_file,
                 "Write every rank's measured timeline as a Chrome trace (Perfetto), in the "
                 "structure of dhelix-plan --trace (cpu backend)");
  app.add_option("--comm-wait", o.comm_wait,
                 "How MPI waits: backoff (test, yield, sleep: leaves the core to compute) or "
                 "spin (MPI's blocking calls)")
      ->capture_default_str()
      ->check(CLI::IsMember({"backoff", "spin"}));
  add_integer_option(app, "--comm-max-sleep-us", o.comm_max_sleep_us, {.min = 1, .max = 100000},
                     "Longest sleep between two MPI tests with --comm-wait backoff, us, default "
                     "50 (shorter: faster MPI progress over TCP, more CPU time)");
  app.add_option("--emulate-link", o.emulate_link,
                 "[KIND=]RATE[@LATENCY], repeatable: collectives and pipeline transfers of KIND "
                 "(tp, cp, ep, dp, pp; every kind when left out) complete when a link of RATE "
                 "(tc's units: 2gbit) and LATENCY per ring step (20us) would have finished "
                 "them; the bytes move through shared memory (cpu backend, one host; "
                 "docs/runtime.md)")
      ->type_name("LINK")
      ->take_all();
  app.add_flag("--pin-compute", o.pin_compute,
               "Pin each rank's compute stream to CPU (local rank mod CPUs)");
}

}  // namespace

int main(int argc, char** argv) {
  // 1. With --backend cuda, CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS before
  //    MPI_Init: a CUDA-aware MPI may start CUDA there, after which CUDA ignores both
  //    (runtime/cuda/cuda_environment.h).
#ifdef DHELIX_WITH_CUDA
  if (dhelix::command_line_asks_for_cuda(argc, argv)) {
    static_cast<void>(dhelix::cuda::process_cuda_environment());
  }
#endif
  // 2. MPI, then this rank's name in messages.
  std::unique_ptr<dhelix::rt::MpiEnvironment> mpi;
  try {
    mpi = std::make_unique<dhelix::rt::MpiEnvironment>(&argc, &argv);
  } catch (const dhelix::Error& error) {
    std::cerr << "dhelix-run: error: " << error.what() << '\n';
    return dhelix::exit_status(error.code());
  }
  const bool several = mpi->world_size() > 1;
  const std::string name = several && mpi->world_rank() > 0
                               ? fmt::format("dhelix-run (rank {})", mpi->world_rank())
                               : "dhelix-run";
  // 3. The command line, then training (run_training) with the backend's engine.
  auto options = std::make_shared<dhelix::rt::TrainOptions>();
  CudaFlags cuda;
  // The checker recomputes the plan's memory figures with the planner's memory model.
  options->plan_figures = dhelix::check_plan_memory_figures;
  // Until training starts, every rank does the same (parses the same command line): a failure
  // there is agreed.
  bool agreed = true;
  const int status = dhelix::run_tool(
      name, argc, argv,
      [&](CLI::App& app) {
        app.description(
            "Trains with a plan on MPI ranks (CPU or CUDA backend). Launch one rank per GPU or "
            "CPU process of the plan: mpirun -np N dhelix-run --plan PLAN ... (or srun -n N), N "
            "being the plan's world size; as root OpenMPI also needs --allow-run-as-root. An "
            "error is printed once, by one rank; mpirun -q leaves out OpenMPI's own notice that "
            "a rank exited with an error.");
        app.footer(R"(
Exit statuses:
  0   training finished (with --verify: both schedules agree bit for bit)
  1   --verify found a difference between the co-executed and the sequential schedule
  2   bad input: a file or flag breaks a rule
  3   a file cannot be read or written
  4   valid input dhelix does not support
  5   a file of another major schema version
  6   the job cannot run as asked
  70  internal error (a bug in dhelix)
)");
        add_options(app, *options, cuda);
        return [&]() -> int {
          agreed = false;
          try {
            const int result =
                dhelix::rt::run_training(*options, *mpi, engine_factory(*options, cuda), std::cout);
            // A status returned, not thrown, is one every rank reached together (a --verify
            // difference, divergence, a stop signal): no rank waits for another.
            agreed = result != 0;
            return result;
          } catch (const dhelix::rt::SetupFailure& failure) {
            agreed = true;
            if (failure.reported_elsewhere()) return dhelix::exit_status(failure.code());
            throw;
          }
        };
      },
      /*quiet_command_line=*/several && mpi->world_rank() > 0);
  // 4. A rank that failed alone would leave the others waiting for it. Failures every rank
  // agreed on (the command line, setup, a --verify mismatch, divergence, a stop signal) end
  // every rank normally.
  if (status > 1 && several && !agreed) dhelix::rt::abort_world(status);
  return status;
}
