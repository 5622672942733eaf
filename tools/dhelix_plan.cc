// dhelix-plan: reads a job (file and/or flags), validates it, and plans how to interleave
// two micro-batch strands:
//
//   dhelix-plan JOB [--profile P] [-o plan.json] [--allow-oom]   plan, print the report
//       [--report text|markdown|json] [--trace T.json] [--svg PREFIX]
//       [--shape auto|w|v|interleaved]
//       [--virtual-pipeline-model-parallel-size V | --num-layers-per-virtual-pipeline-stage K]
//   dhelix-plan JOB --validate-only [--json]                     check and summarise the job
//   dhelix-plan dag JOB [--format dot|json]                      stage 0's layer DAGs
//   dhelix-plan --check PLAN                                     prove a plan safe to run
//   dhelix-plan [JOB] --search --gpus N [-o best.json]           which configuration to use
//
// Without --profile the job's operators are timed on the fly with the analytic model
// (dhelix-profile --backend model); with it, the profile must cover every op of the job.

#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "emitter/chrome_trace.h"
#include "emitter/plan_pictures.h"
#include "emitter/plan_report.h"
#include "emitter/svg_schemes.h"
#include "lib/dag_builder.h"
#include "lib/dag_export.h"
#include "lib/error.h"
#include "lib/job_summary.h"
#include "lib/job_validation.h"
#include "lib/model_shape_checks.h"
#include "lib/placement.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/plan_writer.h"
#include "lib/profile_match.h"
#include "lib/provenance.h"
#include "planner/plan_builder.h"
#include "planner/plan_figures_check.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tools/job_cli.h"
#include "tools/option_values.h"
#include "tools/output_paths.h"
#include "tools/plan_search.h"
#include "tools/progress_bar.h"
#include "tools/tool_main.h"

namespace dhelix {
namespace {

constexpr const char* kToolName = "dhelix-plan";
constexpr const char* kSummarySchemaVersion = "1.0.0";

struct PlanOptions {
  JobOptions job;
  bool validate_only = false;
  bool json = false;
  std::string profile;
  std::string output;
  std::string report = "text";
  std::string trace;
  std::string svg_prefix;
  bool allow_oom = false;
  std::string shape = "auto";         // --shape: the dhelix plan's shape
  bool no_split_backward = false;     // --no-split-backward: the W with whole backwards
  int64_t virtual_pipeline_size = 0;  // Megatron's flags for the interleaved baseline
  int64_t layers_per_virtual_stage = 0;
  std::string check;  // --check PLAN
  SearchCliOptions search;
  // `dag` subcommand
  CLI::App* dag = nullptr;
  JobOptions dag_job;
  std::string dag_format = "dot";
  std::vector<std::string> argv;
  const CLI::App* app = nullptr;  // which flags were given (check_flag_combinations)
};

// The job flags of add_job_options, for the modes that take no job.
const std::vector<std::string> kJobFlags = {
    "JOB",  "--model", "--cluster", "--dp",  "--tp",  "--pp",  "--cp",
    "--ep", "--sp",    "--no-sp",   "--mbs", "--gbs", "--seq", "--rank-order"};
const std::vector<std::string> kPlanningFlags = {"-o",
                                                 "--trace",
                                                 "--svg",
                                                 "--profile",
                                                 "--report",
                                                 "--allow-oom",
                                                 "--shape",
                                                 "--no-split-backward",
                                                 "--virtual-pipeline-model-parallel-size",
                                                 "--num-layers-per-virtual-pipeline-stage"};

void add_plan_options(CLI::App& app, PlanOptions& options) {
  app.description(
      "Plans DHelix strand interleaving for a training job and prints a report.\n"
      "  dhelix-plan JOB [--profile P] [-o plan.json]   plan (profile made on the fly without "
      "--profile)\n"
      "  dhelix-plan JOB --validate-only [--json]       check and summarise the job\n"
      "  dhelix-plan dag JOB [--format dot|json]        print stage 0's layer DAGs\n"
      "  dhelix-plan --check PLAN                       check a plan (docs/plan-check.md)\n"
      "  dhelix-plan [JOB] --search --gpus N            search tp/cp/pp/dp/ep/mbs/recompute "
      "(docs/search.md)");
  add_job_options(app, options.job);
  add_search_options(app, options.search);
  app.add_flag("--validate-only", options.validate_only,
               "Validate the job and print its summary; do not plan");
  app.add_flag("--json", options.json, "With --validate-only: print the summary as JSON");
  app.add_option("--profile", options.profile,
                 "Profile file (dhelix-profile); default: model the job's ops on the fly")
      ->type_name("FILE");
  app.add_option("-o,--output", options.output, "Plan file to write (schemas/plan.schema.json)")
      ->type_name("FILE");
  app.add_option("--report", options.report, "Report format printed: text, markdown or json")
      ->check(CLI::IsMember({"text", "markdown", "json"}));
  app.add_option("--trace", options.trace,
                 "Chrome trace of the predicted iteration (open in Perfetto or chrome://tracing)")
      ->type_name("FILE");
  app.add_option("--svg", options.svg_prefix,
                 "Pictures: PREFIX-pipeline.svg (the dhelix pipeline), PREFIX-pairing.svg (one "
                 "layer's pairing) and PREFIX-schemes.svg (every scheme's pipeline)")
      ->type_name("PREFIX");
  app.add_flag("--allow-oom", options.allow_oom,
               "Write a plan that does not fit in GPU memory (with a warning)");
  app.add_option("--shape", options.shape,
                 "The dhelix plan's pipeline: w (DHelix's W), v (DualPipeV's order with SI "
                 "blocks), interleaved (Megatron's interleaved stages, SI blocks in its "
                 "combined 1F1B order) or auto, the fastest that fits (docs/pipeline.md)")
      ->check(CLI::IsMember({"auto", "w", "v", "interleaved"}));
  app.add_flag("--no-split-backward", options.no_split_backward,
               "Keep the dhelix plan's backwards whole: the W as the paper runs it, no input/"
               "weight-gradient split (and so no V)");
  // At most a model's layer count (lib/model_shape_checks.h): chunks or layers per chunk.
  CLI::Option* vp = add_integer_option(
      app, "--virtual-pipeline-model-parallel-size", options.virtual_pipeline_size,
      kLayerCountRange,
      "Model chunks per stage of the interleaved 1F1B baseline, as Megatron's flag (default: "
      "the largest divisor of the layers per stage up to 8)");
  add_integer_option(app, "--num-layers-per-virtual-pipeline-stage",
                     options.layers_per_virtual_stage, kLayerCountRange,
                     "The same choice as Megatron's other flag: layers per model chunk")
      ->excludes(vp);
  app.add_option("--check", options.check,
                 "Check a plan: collectives, transfers, deadlock, memory (exit 2 on a problem)")
      ->type_name("PLAN");
  options.dag = app.add_subcommand("dag", "Print the layer DAGs of stage 0 (first rank)");
  add_job_options(*options.dag, options.dag_job);
  options.dag->add_option("--format", options.dag_format, "dot (Graphviz) or json")
      ->check(CLI::IsMember({"dot", "json"}));
}

void print_summary(const JobSpec& job, const PlanOptions& options) {
  if (!options.json) {
    std::fputs(job_summary_text(job).c_str(), stdout);
    return;
  }
  OrderedJson out;
  out["schema_version"] = kSummarySchemaVersion;
  out["meta"] = provenance_to_json(make_provenance(kToolName, options.argv, job_input_files(job)));
  out["job"] = job_summary_json(job);
  std::printf("%s\n", out.dump(2).c_str());
}

// The DAGs of stage 0's first rank, as DOT or JSON.
int print_dags(const PlanOptions& options) {
  const JobSpec job = load_job(options.dag_job);
  const LayerDags dags = build_layer_dags(job, 0);
  if (options.dag_format == "json") {
    std::printf("%s\n", dag_to_json(dags).dump(2).c_str());
  } else {
    std::fputs(dag_to_dot(dags, job.name + " layer, rank 0").c_str(), stdout);
  }
  return 0;
}

// The request build_plan needs; the profile is read or modelled into `profile`.
PlanRequest make_request(const JobSpec& job, const PlanOptions& options, Profile& profile) {
  std::vector<std::string> inputs = job_input_files(job);
  if (!options.profile.empty()) inputs.push_back(options.profile);
  PlanRequest request;
  request.job = &job;
  request.meta = provenance_to_json(make_provenance(kToolName, options.argv, inputs));
  if (options.profile.empty()) {
    ProgressBar bar("modelling the op times of " + job.name);  // on a terminal only
    profile = make_model_profile(job, request.meta,
                                 [&bar](int64_t done, int64_t total) { bar.update(done, total); });
    request.profile_name = "the generated model profile";
    request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  } else {
    profile = read_profile(options.profile);
    check_profile_cluster(profile, options.profile, job);
    request.profile_name = options.profile;
    request.profile_ref = {.name = profile_backend_name(profile.backend),
                           .sha256 = sha256_file_hex(options.profile)};
  }
  request.profile = &profile;
  const ClusterSpec cluster = job.cluster;
  request.unprofiled_op_time_us = [cluster](const Op& op) { return op_time_us(cluster, op); };
  request.allow_oom = options.allow_oom;
  request.shape = kShapeRequestNames.parse(options.shape).value_or(ShapeRequest::kAuto);
  request.split_backward = !options.no_split_backward;
  request.keep_timelines = !options.svg_prefix.empty();
  request.virtual_pipeline_size = options.virtual_pipeline_size;
  if (options.layers_per_virtual_stage > 0) {
    const int64_t per_stage = job.model.num_layers / job.parallel.pp;
    if (job.model.num_layers % job.parallel.pp != 0 ||
        per_stage % options.layers_per_virtual_stage != 0) {
      throw Error(
          ErrorCode::kInvalidInput,
          fmt::format("--num-layers-per-virtual-pipeline-stage {}: it must divide the "
                      "layers per stage ({} layers over pp = {})",
                      options.layers_per_virtual_stage, job.model.num_layers, job.parallel.pp));
    }
    request.virtual_pipeline_size = per_stage / options.layers_per_virtual_stage;
  }
  return request;
}

// --svg's third picture: every scheme's pipeline (emitter/svg_schemes.h).
std::string schemes_svg_name(const std::string& prefix) { return prefix + "-schemes.svg"; }

// Where the outputs went, on standard output after the report (not in JSON reports,
// which stay parseable).
void print_written_files(const PlanOptions& options) {
  if (!options.output.empty()) std::printf("plan written to %s\n", options.output.c_str());
  if (!options.trace.empty()) std::printf("trace written to %s\n", options.trace.c_str());
  if (!options.svg_prefix.empty()) {
    std::printf("pictures written to %s-pipeline.svg, %s-pairing.svg and %s-schemes.svg\n",
                options.svg_prefix.c_str(), options.svg_prefix.c_str(), options.svg_prefix.c_str());
  }
}

// A flag the chosen mode would ignore is an error: the user meant something by it.
void check_flag_combinations(const PlanOptions& options) {
  const CLI::App& app = *options.app;
  if (options.dag->parsed()) {
    std::vector<std::string> main_flags = kJobFlags;
    main_flags.insert(main_flags.end(), kPlanningFlags.begin(), kPlanningFlags.end());
    for (const char* flag : {"--check", "--validate-only", "--json"}) main_flags.push_back(flag);
    refuse_flags_with(app, "dag", "prints the DAGs of its own job", main_flags,
                      "give the job and its flags after `dag`");
    return;
  }
  if (!options.check.empty()) {
    std::vector<std::string> flags = kJobFlags;
    flags.insert(flags.end(), kPlanningFlags.begin(), kPlanningFlags.end());
    for (const char* flag : {"--validate-only", "--json"}) flags.push_back(flag);
    refuse_flags_with(app, "--check", "reads a plan only", flags,
                      "check with `dhelix-plan --check PLAN` alone; plan with `dhelix-plan JOB`");
    return;
  }
  if (options.search.search) {
    std::vector<std::string> flags = {"--trace",
                                      "--svg",
                                      "--profile",
                                      "--allow-oom",
                                      "--no-split-backward",
                                      "--check",
                                      "--validate-only",
                                      "--json",
                                      "--virtual-pipeline-model-parallel-size",
                                      "--num-layers-per-virtual-pipeline-stage"};
    refuse_flags_with(app, "--search", "plans every configuration with the model profile", flags,
                      "plan the configuration it finds with `dhelix-plan JOB ...`");
    if (options.report == "markdown") {
      throw Error(ErrorCode::kInvalidInput,
                  "<flags>: --report: \"markdown\" is not available with --search (text or json)");
    }
    return;
  }
  refuse_flags_with(app, "a plan of one configuration", "takes its configuration from the job",
                    search_only_flags(), "add --search to search configurations");
  if (options.validate_only) {
    refuse_flags_with(app, "--validate-only", "writes and prints no plan", kPlanningFlags,
                      "drop --validate-only to plan");
    return;
  }
  refuse_flags_with(app, "--json", "applies to --validate-only only", {"--json"},
                    "print the plan report as JSON with --report json");
}

// Outputs never replace an input or each other, and must be writable, before minutes of
// planning.
void check_outputs(const JobSpec& job, const PlanOptions& options) {
  std::vector<NamedPath> outputs = {{"-o", options.output}, {"--trace", options.trace}};
  if (!options.svg_prefix.empty()) {
    for (const std::string& name : svg_file_names(options.svg_prefix)) {
      outputs.push_back({"--svg", name});
    }
    outputs.push_back({"--svg", schemes_svg_name(options.svg_prefix)});
  }
  std::vector<NamedPath> inputs = {{"--profile", options.profile}};
  for (const std::string& file : job_input_files(job)) inputs.push_back({"the job's input", file});
  check_output_paths(outputs, inputs);
}

// Every output of the run, written together: all of them or none (lib/atomic_file.h).
void write_outputs(const PlanResult& result, const PlanOptions& options) {
  const Plan& plan = result.plan;
  OutputFiles files;
  if (!options.output.empty()) files.add(options.output, plan_to_text(plan));
  if (!options.trace.empty()) files.add(options.trace, chrome_trace_text(plan, TraceOptions{}));
  if (!options.svg_prefix.empty()) {
    add_svg_files(plan, options.svg_prefix, files);
    files.add(schemes_svg_name(options.svg_prefix),
              schemes_svg(result.timelines, plan.job.name + ": every scheme, one iteration"));
  }
  files.commit();
}

// --check: every problem of the plan (exit 2), or a one-line summary.
int check(const PlanOptions& options) {
  const Plan plan = read_plan(options.check);
  ProgressBar bar("checking " + options.check);  // on a terminal only
  const PlanCheckReport report = check_plan(
      plan, options.check, [&bar](int64_t done, int64_t total) { bar.update(done, total); },
      check_plan_memory_figures);
  for (const std::string& warning : report.warnings) print_warning(kToolName, warning);
  std::printf("%s\n", plan_check_summary_text(report, options.check).c_str());
  report.problems.throw_if_any(ErrorCode::kInvalidInput);
  return 0;
}

int plan(const PlanOptions& options) {
  // 0. `dag` subcommand, --check and --search: their output is the whole answer. A flag
  //    the mode ignores is refused.
  check_flag_combinations(options);
  if (options.dag->parsed()) return print_dags(options);
  if (!options.check.empty()) return check(options);
  if (options.search.search) {
    SearchCliOptions search = options.search;
    search.shape = kShapeRequestNames.parse(options.shape).value_or(ShapeRequest::kAuto);
    return run_search(search, options.job, options.report, options.output, options.argv);
  }
  // 1. Load the job file and flags into one validated job (throws every problem at once).
  const JobSpec job = load_job(options.job);
  // 2. Point out settings that are allowed but unusual.
  for (const std::string& warning : job_warnings(job)) print_warning(kToolName, warning);
  // 3. --validate-only: the summary is the whole answer.
  if (options.validate_only) {
    print_summary(job, options);
    return 0;
  }
  // 4. Outputs that would replace an input or each other are refused before any work.
  check_outputs(job, options);
  // 5. Read the profile, or model one for the job's cluster.
  Profile profile;
  PlanRequest request = make_request(job, options, profile);
  // 6. Search, simulate every scheme, check memory, lay out every stage's tasks (with a
  //    progress bar on a terminal).
  ProgressBar bar("planning " + job.name);
  request.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
  const PlanResult result = build_plan(request);
  for (const std::string& warning : result.warnings) print_warning(kToolName, warning);
  // 7. Write the plan, trace and pictures together (all or none), then print the report.
  write_outputs(result, options);
  const ReportFormat format = parse_report_format(options.report).value_or(ReportFormat::kText);
  std::fputs(render_plan_report(result.plan, format).c_str(), stdout);
  if (format != ReportFormat::kJson) print_written_files(options);
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  using namespace dhelix;
  return run_tool(kToolName, argc, argv, [argc, argv](CLI::App& app) {
    auto options = std::make_shared<PlanOptions>();
    options->argv = tool_argv(kToolName, argc, argv);
    options->app = &app;
    add_plan_options(app, *options);
    return [options] { return plan(*options); };
  });
}
