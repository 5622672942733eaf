#include "tools/plan_search.h"

#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "emitter/search_report.h"
#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/plan/plan_writer.h"
#include "lib/provenance.h"
#include "planner/config_search.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "profiler/model_search.h"
#include "tools/option_values.h"
#include "tools/output_paths.h"
#include "tools/progress_bar.h"

namespace dhelix {
namespace {

constexpr const char* kFlags = "<flags>";

// The search options' documented ranges (docs/search.md). --gpus: the largest world dhelix
// plans for (lib/job_validation.cc), so that no absurd count reaches the enumeration.
constexpr IntRange kGpuRange = {.min = 1, .max = int64_t{1} << 24};
constexpr IntRange kParallelSizeRange = {.min = 1, .max = int64_t{1} << 20};
constexpr IntRange kTopRange = {.min = 1, .max = 10000};
constexpr IntRange kThreadRange = {.min = 1, .max = 1024};

SearchConstraints constraints_from(const SearchCliOptions& search, const JobOptions& job) {
  SearchConstraints c;
  c.tp = job.tp;
  c.cp = job.cp;
  c.pp = job.pp;
  c.dp = job.dp;
  c.ep = job.ep;
  c.sp = job.sp;
  c.micro_batch_size = job.micro_batch_size;
  c.max_pp = search.max_pp;
  c.allow_cp = !search.no_cp;
  c.search_recompute = !search.fixed_recompute && !job.recompute_granularity;
  if (job.cp_comm_type) c.cp_comm_type = kCpCommTypeNames.parse(*job.cp_comm_type);
  c.search_fsdp = job.use_megatron_fsdp;
  if (job.fsdp_sharding) c.fsdp_sharding = kFsdpShardingStrategyNames.parse(*job.fsdp_sharding);
  return c;
}

int64_t gpu_count(const SearchCliOptions& search, const JobOptions& options, const JobSpec& job) {
  if (search.gpus > 0) return search.gpus;
  if (!options.job_file.empty()) return job.parallel.world_size();
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: --search: --gpus is required without a job file (the number of "
                          "GPUs to spread the job over)",
                          kFlags));
}

int64_t thread_count(const SearchCliOptions& search) {
  if (search.threads > 0) return search.threads;
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
}

// The plan of the best dhelix configuration, planned again with its provenance.
void write_best_plan(const SearchResult& result, const JobSpec& base, ShapeRequest shape,
                     const std::string& output, const std::vector<std::string>& argv,
                     const std::vector<std::string>& inputs) {
  const ConfigOutcome* best = result.best_dhelix();
  if (best == nullptr) {
    const std::string why = no_best_reason(result, PipelineScheme::kDHelix);
    // Every configuration breaking a rule is bad input; only memory is infeasibility.
    const bool memory = why.starts_with("none fits in memory");
    throw Error(memory ? ErrorCode::kInfeasible : ErrorCode::kInvalidInput,
                fmt::format("-o {}: no dhelix plan to write: {}", output, why));
  }
  const JobSpec job = configuration_job(base, best->parallel);
  PlanRequest request;
  request.job = &job;
  request.shape = shape;
  request.meta = provenance_to_json(make_provenance("dhelix-plan", argv, inputs));
  const Profile profile = make_model_profile(job, request.meta);
  request.profile = &profile;
  request.profile_name = "the generated model profile";
  request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  const ClusterSpec cluster = job.cluster;
  request.unprofiled_op_time_us = [cluster](const Op& op) { return op_time_us(cluster, op); };
  OutputFiles files;
  files.add(output, plan_to_text(build_plan(request).plan));
  files.commit();
}

}  // namespace

void add_search_options(CLI::App& app, SearchCliOptions& o) {
  app.add_flag("--search", o.search,
               "Search the parallel configurations (tp, sp, cp, pp, dp, ep, mbs, recompute) "
               "for the fastest under dhelix and under Megatron-LM 1F1B (docs/search.md)");
  add_integer_option(app, "--gpus", o.gpus, kGpuRange,
                     "With --search: GPUs to spread the job over");
  add_integer_option(app, "--max-pp", o.max_pp, kParallelSizeRange,
                     "With --search: at most this many pipeline stages");
  app.add_flag("--no-cp", o.no_cp, "With --search: no context parallelism");
  app.add_flag("--no-recompute-search", o.fixed_recompute,
               "With --search: keep the job's recompute setting instead of searching it");
  add_integer_option(app, "--top", o.top_k, kTopRange,
                     "With --search: configurations listed per scheme");
  add_integer_option(app, "--threads", o.threads, kThreadRange,
                     "With --search: worker threads, default every core");
  app.add_flag("--all-schemes", o.all_schemes,
               "With --search: the text report also names the best configuration planned under "
               "each other baseline (Wavelet+, intra-batch, ...)");
}

const std::vector<std::string>& search_only_flags() {
  static const std::vector<std::string> flags = {
      "--gpus", "--max-pp",  "--no-cp",      "--no-recompute-search",
      "--top",  "--threads", "--all-schemes"};
  return flags;
}

int run_search(const SearchCliOptions& search, const JobOptions& job_options,
               const std::string& report_format, const std::string& output,
               const std::vector<std::string>& argv) {
  // 1. The job without its parallel sizes: model, cluster, batch, sequence, cost settings.
  const JobSpec base = load_unvalidated_job(job_options);
  const std::vector<std::string> inputs = job_input_files(base);
  // 2. An output that would replace an input is refused before minutes of search.
  std::vector<NamedPath> input_paths;
  for (const std::string& file : inputs) input_paths.push_back({"the job's input", file});
  check_output_paths({{"-o", output}}, input_paths);
  // 3. Search with the analytic model as the profile of every configuration.
  SearchRequest request;
  request.base = base;
  request.gpus = gpu_count(search, job_options, base);
  request.constraints = constraints_from(search, job_options);
  request.top_k = search.top_k;
  request.shape = search.shape;
  request.threads = thread_count(search);
  use_model_profiles(request);
  ProgressBar bar("searching configurations");  // on a terminal only
  request.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
  const SearchResult result = search_configurations(request);
  // 4. The best plan, then the report.
  if (!output.empty()) write_best_plan(result, base, search.shape, output, argv, inputs);
  const SearchReportContext context{
      .model = base.model.name,
      .cluster = base.cluster.name,
      .gpus = request.gpus,
      .global_batch_size = base.parallel.global_batch_size,
      .seq_length = base.parallel.seq_length,
      .top_k = search.top_k,
      .meta = provenance_to_json(make_provenance("dhelix-plan", argv, inputs)),
      .all_schemes = search.all_schemes};
  const bool json = report_format == "json";
  std::fputs(
      (json ? search_report_json(result, context) : search_report_text(result, context)).c_str(),
      stdout);
  if (!output.empty() && !json) {
    std::printf("plan of the best dhelix configuration written to %s\n", output.c_str());
  }
  return 0;
}

}  // namespace dhelix
