// dhelix-profile: times every operator of a job's layer DAGs, and every pair the planner may
// overlap, and writes a profile (schemas/profile.schema.json). The `model` backend uses the
// analytic cost model (docs/cost-model.md); `cpu` measures the CPU runtime's kernels and MPI
// collectives on every rank of an MPI job (profiler/cpu/cpu_backend.h); `cuda` measures cuBLAS
// GEMMs and NCCL collectives on every GPU of the job (profiler/cuda/cuda_backend.h,
// docs/gpu.md).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "lib/job_validation.h"
#include "lib/profile.h"
#include "lib/provenance.h"
#include "profiler/cpu/cold_operands.h"
#include "profiler/cpu/cpu_backend.h"
#ifdef DHELIX_WITH_CUDA
#include "profiler/cuda/cuda_backend.h"
#include "profiler/cuda/cuda_setup.h"
#include "runtime/cuda/cuda_environment.h"
#endif
#include "profiler/model_backend.h"
#include "profiler/trace_profile.h"
#include "runtime/comm/mpi_environment.h"
#include "tools/job_cli.h"
#include "tools/option_values.h"
#include "tools/output_paths.h"
#include "tools/progress_bar.h"
#include "tools/tool_main.h"

namespace dhelix {
namespace {

constexpr const char* kToolName = "dhelix-profile";

struct ProfileOptions {
  JobOptions job;
  std::string backend = "model";
  std::string output;
  bool list = false;
  int64_t warmup = 3;  // tiny-tp2 on 2 cores: about 3 s in all
  int64_t samples = 15;
  int blas_threads = 1;
  bool warm_caches = false;               // cpu: --warm-caches (profiler/cpu/cold_operands.h)
  int64_t max_samples = 200;              // cuda: --samples is the minimum, this the cap
  std::vector<std::string> from_trace;    // --from-trace: dhelix-run --trace files
  std::string base;                       // --base: profile for what the traces lack
  std::vector<std::string> emulate_link;  // cpu: --emulate-link (runtime/comm/link_emulation.h)
  std::vector<std::string> argv;
  const CLI::App* app = nullptr;  // which flags were given (check_flag_combinations)
};

// MPI, started only for --backend cpu, and whether the ranks had begun measuring: a rank
// that fails then may leave the others waiting in a collective.
struct MpiSession {
  std::unique_ptr<rt::MpiEnvironment> environment;
  bool measuring = false;
};

void add_profile_options(CLI::App& app, ProfileOptions& options) {
  app.description("Models or measures operator times of a job and writes a profile.");
  add_job_options(app, options.job);
  app.add_option("--backend", options.backend, "model (analytic), cpu or cuda (measured)")
      ->check(CLI::IsMember({"model", "cpu", "cuda"}));
  app.add_option("-o,--output", options.output, "Profile file to write")->type_name("FILE");
  app.add_flag("--list", options.list, "Print the ops and pairs a profile covers; time nothing");
  add_integer_option(app, "--samples", options.samples, {.min = 1, .max = 1000},
                     "cpu: timed runs per op and per pair");
  add_integer_option(app, "--warmup", options.warmup, {.min = 0, .max = 1000},
                     "cpu: untimed runs before the samples");
  add_integer_option(app, "--blas-threads", options.blas_threads, {.min = 1, .max = 256},
                     "cpu: OpenBLAS threads per rank");
  app.add_flag("--warm-caches", options.warm_caches,
               "cpu: time GEMMs, the router, the head and the embedding on the same buffers "
               "over and over (their weights in the caches) instead of cycling through copies "
               "larger than the last-level cache, as a training step finds them "
               "(profiler/cpu/cold_operands.h)");
  app.add_option("--from-trace", options.from_trace,
                 "Make the profile from dhelix-run --trace timelines instead: solo times from "
                 "--sequential runs, pairs from co-executed runs")
      ->option_text("TRACE...");
  app.add_option("--base", options.base,
                 "With --from-trace: a profile of the same job for the ops and pairs the "
                 "traces do not time")
      ->option_text("PROFILE");
  app.add_option("--emulate-link", options.emulate_link,
                 "cpu: [KIND=]RATE[@LATENCY], repeatable: collectives of KIND (tp, cp, ep, dp, "
                 "pp; every kind when left out) complete when a link of RATE (tc's units: "
                 "2gbit) and LATENCY per ring step (20us) would have finished them, as "
                 "dhelix-run --emulate-link (docs/runtime.md)")
      ->type_name("LINK")
      ->take_all();
  add_integer_option(
      app, "--max-samples", options.max_samples, {.min = 1, .max = 100000},
      "cuda: most timed runs per op and pair (fewer once the median is known to 1 %)");
}

// A one-line progress bar on stderr, drawn only when stderr is a terminal (tools/progress_bar.h).
ProgressCallback progress_bar() {
  auto bar = std::make_shared<ProgressBar>(std::string(kToolName) + ": profiling");
  return [bar](int64_t done, int64_t total) { bar->update(done, total); };
}

// Every rank measures; the profile holds rank 0's times.
Profile measure_on_cpu(const ProfileOptions& options, const JobSpec& job, const OrderedJson& meta,
                       MpiSession& mpi) {
  const rt::MpiEnvironment& environment = *mpi.environment;
  // Every rank sees the same job and world, so a wrong rank count stops all alike.
  check_cpu_world_size(collect_profile_space(job), environment.world_size());
  rt::LinkEmulation links = rt::LinkEmulation::parse(options.emulate_link);
  mpi.measuring = true;
  const CpuProfileOptions cpu{
      .timing = {.warmup = options.warmup, .samples = options.samples},
      .blas_threads = options.blas_threads,
      .cold_operand_bytes = options.warm_caches ? 0 : cpu_profile::host_last_level_cache_bytes(),
      .world_rank = environment.world_rank(),
      .world_size = environment.world_size(),
      .link_emulation = std::move(links)};
  return make_cpu_profile(job, meta, cpu,
                          environment.world_rank() == 0 ? progress_bar() : ProgressCallback{});
}

// Every rank measures on its own GPU; the profile pools all ranks' samples.
Profile measure_on_cuda(const ProfileOptions& options, const JobSpec& job, const OrderedJson& meta,
                        MpiSession& mpi) {
#ifdef DHELIX_WITH_CUDA
  const rt::MpiEnvironment& environment = *mpi.environment;
  // A machine without GPUs, or the wrong rank count, fails every rank alike: no collective yet.
  check_cuda_device_present();
  cuda_profile::check_cuda_world_size(job, environment.world_size());
  // CUDA's start-up settings made too late are not what training will run with.
  if (environment.world_rank() == 0) {
    for (const std::string& note : cuda::late_setting_notes(cuda::process_cuda_environment())) {
      print_warning(kToolName, note);
    }
  }
  mpi.measuring = true;
  const CudaProfileOptions cuda{
      .sampling = {.warmup = options.warmup,
                   .min_samples = std::min(options.samples, options.max_samples),
                   .max_samples = options.max_samples},
      .world_rank = environment.world_rank(),
      .world_size = environment.world_size()};
  return make_cuda_profile(job, meta, cuda,
                           environment.world_rank() == 0
                               ? cuda_profile::timed_progress_bar(kToolName)
                               : ProgressCallback{});
#else
  (void)options, (void)job, (void)meta, (void)mpi;
  throw Error(ErrorCode::kUnsupported,
              "--backend cuda: this dhelix-profile was built without CUDA (configure with the "
              "CUDA toolkit and NCCL installed; docs/gpu.md)");
#endif
}

// A flag the chosen backend or --list would ignore is an error: the user meant something.
void check_flag_combinations(const ProfileOptions& options) {
  const CLI::App& app = *options.app;
  if (options.list) {
    refuse_flags_with(app, "--list", "times nothing and writes no profile",
                      {"-o", "--samples", "--warmup", "--blas-threads", "--max-samples",
                       "--emulate-link", "--warm-caches"},
                      "drop --list to profile");
    return;
  }
  if (options.output.empty()) {
    throw Error(ErrorCode::kInvalidInput, "<flags>: -o: an output file is required (or --list)");
  }
  if (!options.from_trace.empty()) {
    refuse_flags_with(app, "--from-trace", "reads measured timelines, it runs nothing",
                      {"--backend", "--samples", "--warmup", "--blas-threads", "--max-samples",
                       "--emulate-link", "--warm-caches"},
                      "drop them, or drop --from-trace to measure");
    return;
  }
  if (!options.base.empty()) {
    throw Error(ErrorCode::kInvalidInput, "<flags>: --base is only read with --from-trace");
  }
  if (options.backend == "model") {
    refuse_flags_with(app, "--backend model", "computes times, it measures nothing",
                      {"--samples", "--warmup", "--blas-threads", "--max-samples", "--emulate-link",
                       "--warm-caches"},
                      "measure with --backend cpu or cuda");
  } else if (options.backend == "cpu") {
    refuse_flags_with(app, "--backend cpu", "takes a fixed number of samples", {"--max-samples"},
                      "--max-samples is for --backend cuda");
  } else {
    refuse_flags_with(app, "--backend cuda", "uses no OpenBLAS and times NCCL on real links",
                      {"--blas-threads", "--emulate-link", "--warm-caches"},
                      "these flags are for --backend cpu");
  }
}

int profile(const ProfileOptions& options, MpiSession& mpi) {
  // 1. Flags that the mode ignores, and a missing -o, are refused.
  check_flag_combinations(options);
  // 2. --backend cpu and cuda run on every rank of an MPI job: start MPI (not for --list).
  const bool traced = !options.from_trace.empty();
  const bool cpu = options.backend == "cpu" && !options.list && !traced;
  const bool cuda = options.backend == "cuda" && !options.list && !traced;
  //    --backend cuda sets the environment CUDA reads when it starts before that: a
  //    CUDA-aware MPI may start CUDA in MPI_Init (runtime/cuda/cuda_environment.h), and
  //    the profile must be measured under the settings dhelix-run trains with.
#ifdef DHELIX_WITH_CUDA
  if (cuda) static_cast<void>(cuda::process_cuda_environment());
#endif
  if (cpu || cuda) mpi.environment = std::make_unique<rt::MpiEnvironment>(nullptr, nullptr);
  const bool lead = !(cpu || cuda) || mpi.environment->world_rank() == 0;
  // 3. Load the job file and flags into one validated job.
  const JobSpec job = load_job(options.job);
  if (lead) {
    for (const std::string& warning : job_warnings(job)) print_warning(kToolName, warning);
  }
  // 4. --list: the op and pair space, nothing timed.
  if (options.list) {
    for (const std::string& line : list_profile_space(job)) std::printf("%s\n", line.c_str());
    return 0;
  }
  // 5. The profile must not replace the job or one of its files, and must be writable
  //    (every rank sees the same files, so every rank stops alike).
  std::vector<NamedPath> inputs;
  for (const std::string& file : job_input_files(job)) inputs.push_back({"the job's input", file});
  for (const std::string& file : options.from_trace) inputs.push_back({"--from-trace", file});
  if (!options.base.empty()) inputs.push_back({"--base", options.base});
  check_output_paths({{"-o", options.output}}, inputs);
  // 6. Model or measure every op and pair; rank 0 writes the profile atomically.
  std::vector<std::string> files = job_input_files(job);
  files.insert(files.end(), options.from_trace.begin(), options.from_trace.end());
  if (!options.base.empty()) files.push_back(options.base);
  const OrderedJson meta = provenance_to_json(make_provenance(kToolName, options.argv, files));
  if (traced) {
    std::vector<NamedTrace> traces;
    for (const std::string& file : options.from_trace) {
      traces.push_back({file, read_json_file(file)});
    }
    const std::optional<Profile> base =
        options.base.empty() ? std::nullopt : std::optional<Profile>(read_profile(options.base));
    std::vector<std::string> warnings;
    const Profile profile =
        profile_from_traces(job, traces, base ? &*base : nullptr, meta, &warnings);
    for (const std::string& warning : warnings) print_warning(kToolName, warning);
    write_profile(options.output, profile);
    return 0;
  }
  const Profile result = cuda  ? measure_on_cuda(options, job, meta, mpi)
                         : cpu ? measure_on_cpu(options, job, meta, mpi)
                               : make_model_profile(job, meta, progress_bar());
  mpi.measuring = false;  // past the last collective: failures from here end ranks normally
  if (lead) write_profile(options.output, result);
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  using namespace dhelix;
  MpiSession mpi;
  const int status = run_tool(kToolName, argc, argv, [argc, argv, &mpi](CLI::App& app) {
    auto options = std::make_shared<ProfileOptions>();
    options->argv = tool_argv(kToolName, argc, argv);
    options->app = &app;
    add_profile_options(app, *options);
    return [options, &mpi]() -> int {
      try {
        return profile(*options, mpi);
      } catch (const Error& error) {
        // Before measuring every rank fails alike (same job, same world): rank 0 says why.
        const bool follower = mpi.environment && mpi.environment->world_rank() > 0;
        if (follower && !mpi.measuring) return exit_status(error.code());
        throw;
      }
    };
  });
  // A rank that failed alone while measuring would leave the others blocked in a collective.
  if (status != 0 && mpi.measuring && mpi.environment->world_size() > 1) {
    rt::abort_world(status);
  }
  return status;
}
