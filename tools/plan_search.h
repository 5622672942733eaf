#pragma once
// `dhelix-plan --search`: which parallel configuration should this job use?
//
//   dhelix-plan --model M --cluster C --gpus N --gbs B --seq S --search [-o best.json]
//       [--tp 8] [--max-pp 4] [--no-cp] [--top N] [--threads N] [--all-schemes]
//       [--report text|json]
//
// The job's parallel flags (--tp, --cp, --pp, --dp, --ep, --sp/--no-sp, --mbs) become
// constraints; a job file's own parallel sizes are ignored (its model, cluster, batch and
// cost-model settings are used). Every configuration is planned with the analytic model
// profile (dhelix-profile --backend model). docs/search.md explains the search.

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/job_cli.h"

#include "lib/plan/plan_kinds.h"

namespace dhelix {

struct SearchCliOptions {
  bool search = false;
  int64_t gpus = 0;  ///< 0: the job file's world size
  int64_t max_pp = 0;
  bool no_cp = false;
  bool fixed_recompute = false;  ///< --no-recompute-search: keep the job's recompute setting
  int64_t top_k = 5;
  int64_t threads = 0;       ///< 0: every core
  bool all_schemes = false;  ///< --all-schemes: the text report adds the other baselines
  /// dhelix-plan's --shape: the dhelix plans' shapes (planner/dhelix_shapes.h).
  ShapeRequest shape = ShapeRequest::kAuto;
};

/// Adds --search, --gpus, --max-pp, --no-cp, --no-recompute-search, --top, --threads and
/// --all-schemes.
void add_search_options(CLI::App& app, SearchCliOptions& options);

/// The flags only --search takes (refused without it).
const std::vector<std::string>& search_only_flags();

/// Runs the search and prints the report; writes the best dhelix configuration's plan to
/// `output` when it is not empty. Returns the exit status.
int run_search(const SearchCliOptions& search, const JobOptions& job_options,
               const std::string& report_format, const std::string& output,
               const std::vector<std::string>& argv);

}  // namespace dhelix
