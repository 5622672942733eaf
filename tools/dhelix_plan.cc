// dhelix-plan: reads a job (file and/or flags), validates it, and plans how to interleave
// two micro-batch strands. For now it validates and summarises the job (--validate-only);
// the planner arrives with its own issue.

#include <cstdio>
#include <memory>

#include "lib/job_summary.h"
#include "lib/job_validation.h"
#include "lib/provenance.h"
#include "tools/job_cli.h"
#include "tools/tool_main.h"

namespace dhelix {
namespace {

constexpr const char* kToolName = "dhelix-plan";
constexpr const char* kSummarySchemaVersion = "1.0.0";

struct PlanOptions {
  JobOptions job;
  bool validate_only = false;
  bool json = false;
  std::vector<std::string> argv;
};

void add_plan_options(CLI::App& app, PlanOptions& options) {
  app.description("Plans DHelix strand interleaving for a training job.");
  add_job_options(app, options.job);
  app.add_flag("--validate-only", options.validate_only,
               "Validate the job and print its summary; do not plan");
  app.add_flag("--json", options.json, "Print the summary as JSON (with a meta block)");
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

int plan(const PlanOptions& options) {
  // 1. Load the job file and flags into one validated job (throws every problem at once).
  const JobSpec job = load_job(options.job);
  // 2. Point out settings that are allowed but unusual.
  for (const std::string& warning : job_warnings(job)) print_warning(kToolName, warning);
  // 3. --validate-only: the summary is the whole answer.
  if (options.validate_only) {
    print_summary(job, options);
    return 0;
  }
  // 4. Planning (profile, pairing search, folding, pipeline, emit) arrives with the planner.
  throw Error(ErrorCode::kUnsupported,
              "planning is not implemented yet (it arrives with the planner issue); use "
              "--validate-only to check and summarise the job");
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  using namespace dhelix;
  return run_tool(kToolName, argc, argv, [argc, argv](CLI::App& app) {
    auto options = std::make_shared<PlanOptions>();
    options->argv = tool_argv(kToolName, argc, argv);
    add_plan_options(app, *options);
    return [options] { return plan(*options); };
  });
}
