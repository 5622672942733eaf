// dhelix-diff: compares two plans (docs/diff.md) and, for CI, fails on a slowdown or on any
// change; with --measured TRACE, compares a plan with the timeline dhelix-run --trace
// measured (emitter/measured_diff.h). Exit statuses: 0 no --fail-if condition met, 1 one
// was (reasons on stderr), 2 bad input, 3 unreadable file, 5 a plan of another major schema
// version.

#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "emitter/measured_diff.h"
#include "emitter/plan_diff.h"
#include "lib/error.h"
#include "lib/json_reader.h"
#include "lib/plan/plan_reader.h"
#include "lib/provenance.h"
#include "tools/tool_main.h"

namespace {

constexpr const char* kTool = "dhelix-diff";
constexpr int kExitCheckFailed = 1;

constexpr const char* kExitStatuses = R"(
Exit statuses:
  0  no --fail-if condition met (the plans may still differ)
  1  a --fail-if condition met, or (--measured) a rank's model states hold another
     parameter count than the plan's stage; each reason is printed on stderr
  2  bad input: a malformed plan or a bad flag
  3  a plan file cannot be read
  5  a plan of another major schema version
)";

struct DiffFlags {
  std::string plan_a;
  std::string plan_b;
  bool json = false;
  std::optional<double> fail_if_slower_pct;
  bool fail_if_changed = false;
  std::string measured;  ///< --measured TRACE: predicted vs measured instead of A vs B
  std::optional<double> fail_if_off_pct;
};

// A CI gate's threshold: a finite number of percent, at least 0. CLI11's own check let
// "nan" through (every comparison with NaN is false, so the gate never failed) and printed
// its bound as a 309-digit number.
double parse_percent(const std::string& text, const char* flag) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end || !std::isfinite(value) || value < 0) {
    throw CLI::ValidationError(
        flag, fmt::format("\"{}\" is not a percentage: give a finite number, at least 0 (5 "
                          "fails on a difference of more than 5 %)",
                          text));
  }
  return value;
}

// --measured: the plan's prediction against a measured timeline.
int run_measured(const DiffFlags& flags, const std::vector<std::string>& argv) {
  const dhelix::Plan plan = dhelix::read_plan(flags.plan_a);
  const dhelix::Json trace = dhelix::read_json_file(flags.measured);
  dhelix::MeasuredDiff diff =
      dhelix::compare_measured(plan, trace, flags.measured, flags.fail_if_off_pct);
  diff.plan_label = flags.plan_a;
  for (const std::string& warning : diff.warnings) {
    dhelix::print_warning(kTool, warning);
  }
  if (flags.json) {
    dhelix::OrderedJson out = dhelix::measured_diff_json(diff);
    out["provenance"] = dhelix::provenance_to_json(
        dhelix::make_provenance(kTool, argv, {flags.plan_a, flags.measured}));
    std::fputs((out.dump(2) + "\n").c_str(), stdout);
  } else {
    std::fputs(dhelix::measured_diff_text(diff).c_str(), stdout);
  }
  for (const std::string& failure : diff.failures) {
    std::fprintf(stderr, "%s: failed: %s\n", kTool, failure.c_str());
  }
  return diff.failures.empty() ? 0 : kExitCheckFailed;
}

int run_diff(const DiffFlags& flags, const std::vector<std::string>& argv) {
  if (!flags.measured.empty()) {
    if (!flags.plan_b.empty() || flags.fail_if_slower_pct || flags.fail_if_changed) {
      throw dhelix::Error(dhelix::ErrorCode::kInvalidInput,
                          "--measured compares one plan with a trace: give no plan B, "
                          "--fail-if-slower or --fail-if-changed with it");
    }
    return run_measured(flags, argv);
  }
  if (flags.plan_b.empty()) {
    throw dhelix::Error(dhelix::ErrorCode::kInvalidInput,
                        "give two plans A and B, or one plan and --measured TRACE");
  }
  if (flags.fail_if_off_pct) {
    throw dhelix::Error(dhelix::ErrorCode::kInvalidInput, "--fail-if-off needs --measured TRACE");
  }
  // Load both plans (strict reader: schema version, unknown keys, ranges).
  const dhelix::Plan a = dhelix::read_plan(flags.plan_a);
  const dhelix::Plan b = dhelix::read_plan(flags.plan_b);

  // Compare, and check the CI conditions asked for.
  dhelix::DiffOptions options;
  options.fail_if_slower_pct = flags.fail_if_slower_pct;
  options.fail_if_changed = flags.fail_if_changed;
  dhelix::PlanDiff diff = dhelix::diff_plans(a, b, options);
  diff.label_a = flags.plan_a;
  diff.label_b = flags.plan_b;

  // Render on stdout; reasons for failing on stderr too, where CI logs show them.
  if (flags.json) {
    const dhelix::Provenance provenance =
        dhelix::make_provenance(kTool, argv, {flags.plan_a, flags.plan_b});
    std::fputs(
        (dhelix::plan_diff_to_json(diff, dhelix::provenance_to_json(provenance)).dump(2) + "\n")
            .c_str(),
        stdout);
  } else {
    std::fputs(dhelix::plan_diff_to_text(diff).c_str(), stdout);
  }
  for (const std::string& failure : diff.failures) {
    std::fprintf(stderr, "%s: failed: %s\n", kTool, failure.c_str());
  }
  return diff.failures.empty() ? 0 : kExitCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = dhelix::tool_argv(kTool, argc, argv);
  return dhelix::run_tool(kTool, argc, argv, [&args](CLI::App& app) {
    auto flags = std::make_shared<DiffFlags>();
    app.description(
        "Compares two plans written by dhelix-plan: inputs (model, parallel settings, cluster, "
        "profile), the layer pairings (blocks added, removed, changed), and the predicted "
        "figures of every scheme, with a short summary. Numbers within a relative 1e-6 are "
        "equal.");
    app.footer(kExitStatuses);
    app.add_option("A", flags->plan_a, "The plan to compare from (e.g. main's plan)")
        ->option_text("FILE")
        ->required();
    app.add_option("B", flags->plan_b,
                   "The plan to compare to (e.g. a pull request's plan); none with --measured")
        ->option_text("FILE");
    app.add_option("--measured", flags->measured,
                   "Compare plan A's prediction with this timeline of dhelix-run --trace: per op "
                   "kind, per SI block and for the iteration, and each rank's memory")
        ->option_text("TRACE");
    app.add_option_function<std::string>(
           "--fail-if-off",
           [flags](const std::string& text) {
             flags->fail_if_off_pct = parse_percent(text, "--fail-if-off");
           },
           "With --measured: exit 1 when the measured iteration time is more than PCT % off "
           "the predicted")
        ->option_text("PCT");
    app.add_flag("--json", flags->json, "Write the diff as JSON (deterministic) instead of text");
    app.add_option_function<std::string>(
           "--fail-if-slower",
           [flags](const std::string& text) {
             flags->fail_if_slower_pct = parse_percent(text, "--fail-if-slower");
           },
           "Exit 1 when dhelix's iteration time on B is more than PCT % above A's")
        ->option_text("PCT");
    app.add_flag("--fail-if-changed", flags->fail_if_changed,
                 "Exit 1 on any change in the pairing or the predicted figures (provenance "
                 "such as the tool version or input hashes alone does not count)");
    return [flags, &args]() { return run_diff(*flags, args); };
  });
}
