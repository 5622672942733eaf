#include "lib/plan_identity.h"

#include <fmt/format.h>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/json_difference.h"
#include "lib/model_reader.h"
#include "lib/provenance.h"

namespace dhelix {
namespace {

std::string short_hash(const std::string& sha256) { return sha256.substr(0, 12); }

}  // namespace

PlanIdentity plan_identity(const JobSpec& job) {
  PlanIdentity identity;
  identity.job["model"] = model_to_json(job.model);
  identity.job["cluster"] = cluster_to_json(job.cluster);
  identity.job["parallel"] = parallel_to_json(job.parallel);
  identity.sha256 =
      sha256_hex(identity.job["model"].dump() + "\n" + identity.job["cluster"].dump() + "\n" +
                 identity.job["parallel"].dump());
  return identity;
}

OrderedJson plan_identity_json(const PlanIdentity& identity) {
  return OrderedJson{{"sha256", identity.sha256}, {"job", identity.job}};
}

std::optional<std::string> check_trace_identity(const Json& other_data,
                                                const PlanIdentity& expected,
                                                const std::string& trace_file,
                                                const std::string& against) {
  const auto recorded = other_data.find("plan_identity");
  if (recorded == other_data.end()) {
    return fmt::format(
        "{}: /otherData/plan_identity: absent (a trace of dhelix-run before plan identities); "
        "only the job's name was checked against {}: run dhelix-run --trace again to have the "
        "whole job checked",
        trace_file, against);
  }
  const auto sha = recorded->is_object() ? recorded->find("sha256") : recorded->end();
  if (!recorded->is_object() || sha == recorded->end() || !sha->is_string()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: /otherData/plan_identity: {} must be an object with the "
                            "plan's \"sha256\" (written by dhelix-run --trace)",
                            trace_file, json_value_text(*recorded)));
  }
  const std::string trace_sha = sha->get<std::string>();
  if (trace_sha == expected.sha256) return std::nullopt;
  std::string field;
  const auto job = recorded->find("job");
  if (job != recorded->end()) {
    const Json expected_job = Json::parse(expected.job.dump());
    if (const auto found = first_json_difference(*job, expected_job)) {
      field = fmt::format("; first difference: {} (trace vs ours)", json_difference_text(*found));
    }
  }
  throw Error(
      ErrorCode::kInvalidInput,
      fmt::format("{}: /otherData/plan_identity/sha256: {} was measured with another "
                  "plan than {} (plan identity {}){}; trace a run of this plan, or "
                  "compare with the plan the trace was measured with",
                  trace_file, short_hash(trace_sha), against, short_hash(expected.sha256), field));
}

}  // namespace dhelix
