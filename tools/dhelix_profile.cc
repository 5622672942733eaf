// dhelix-profile: times every operator of a job's layer DAGs, and every pair the planner may
// overlap, and writes a profile (schemas/profile.schema.json). The `model` backend uses the
// analytic cost model (docs/cost-model.md); `cpu` and `cuda` measure and arrive with the
// runtime.

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "lib/job_validation.h"
#include "lib/profile.h"
#include "lib/provenance.h"
#include "profiler/model_backend.h"
#include "tools/job_cli.h"
#include "tools/tool_main.h"

namespace dhelix {
namespace {

constexpr const char* kToolName = "dhelix-profile";

struct ProfileOptions {
  JobOptions job;
  std::string backend = "model";
  std::string output;
  bool list = false;
  std::vector<std::string> argv;
};

void add_profile_options(CLI::App& app, ProfileOptions& options) {
  app.description("Models or measures operator times of a job and writes a profile.");
  add_job_options(app, options.job);
  app.add_option("--backend", options.backend, "model (analytic), cpu or cuda (measured)")
      ->check(CLI::IsMember({"model", "cpu", "cuda"}));
  app.add_option("-o,--output", options.output, "Profile file to write");
  app.add_flag("--list", options.list, "Print the ops and pairs a profile covers; time nothing");
}

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
ProgressCallback progress_bar() {
  if (isatty(STDERR_FILENO) == 0) return {};
  return [](int64_t done, int64_t total) {
    constexpr int kWidth = 40;
    const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
    std::fprintf(stderr, "\r%s [%-*s] %lld/%lld", kToolName, kWidth,
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done == total) std::fputc('\n', stderr);
  };
}

int profile(const ProfileOptions& options) {
  // 1. Only the analytic backend exists so far.
  if (options.backend != "model") {
    throw Error(ErrorCode::kUnsupported,
                "--backend " + options.backend +
                    " is not available yet: measuring needs dhelix's runtime kernels, which "
                    "this version does not ship; use --backend model");
  }
  if (!options.list && options.output.empty()) {
    throw Error(ErrorCode::kInvalidInput, "<flags>: -o: an output file is required (or --list)");
  }
  // 2. Load the job file and flags into one validated job.
  const JobSpec job = load_job(options.job);
  for (const std::string& warning : job_warnings(job)) print_warning(kToolName, warning);
  // 3. --list: the op and pair space, nothing timed.
  if (options.list) {
    for (const std::string& line : list_profile_space(job)) std::printf("%s\n", line.c_str());
    return 0;
  }
  // 4. Model every op and pair, then write the profile atomically.
  const OrderedJson meta =
      provenance_to_json(make_provenance(kToolName, options.argv, job_input_files(job)));
  const Profile result = make_model_profile(job, meta, progress_bar());
  write_profile(options.output, result);
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  using namespace dhelix;
  return run_tool(kToolName, argc, argv, [argc, argv](CLI::App& app) {
    auto options = std::make_shared<ProfileOptions>();
    options->argv = tool_argv(kToolName, argc, argv);
    add_profile_options(app, *options);
    return [options] { return profile(*options); };
  });
}
