#include "lib/plan/plan_job.h"

#include <fmt/format.h>

#include <vector>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/provenance.h"
#include "lib/text.h"

namespace dhelix {
namespace {

std::string short_hash(const std::string& sha256) { return sha256.substr(0, 12); }

}  // namespace

JobSpec job_from_plan(const Plan& plan, const std::string& plan_file) {
  Json json = Json::object();
  json["schema_version"] = "1.0.0";
  json["name"] = plan.job.name;
  json["model"] = Json::parse(plan.job.model.dump());
  json["cluster"] = Json::parse(plan.job.cluster.dump());
  json["parallel"] = Json::parse(plan.job.parallel.dump());
  ProblemList problems;
  JobSpec job = job_from_json(json, plan_file + " (its /job)", "", problems);
  problems.throw_if_any(ErrorCode::kInvalidInput);
  // The job's rules and size limits too (lib/job_validation.h): every reader of a plan
  // (the checker, dhelix-run, dhelix-diff) sizes schedules, programs and buffers from it,
  // so an edited plan with 2^62 micro-batches must stop here, not in an allocation.
  validate_job(job).throw_if_any(ErrorCode::kInvalidInput);
  job.source_file = plan_file;
  return job;
}

void check_plan_matches_job(const Plan& plan, const std::string& plan_file, const JobSpec& job,
                            const std::string& job_file) {
  std::vector<std::string> differences;
  const std::string model_hash = sha256_hex(model_to_json(job.model).dump());
  if (model_hash != plan.inputs.model.sha256) {
    differences.push_back(fmt::format("model {} (sha256 {}) vs {} (sha256 {})",
                                      plan.inputs.model.name, short_hash(plan.inputs.model.sha256),
                                      job.model.name, short_hash(model_hash)));
  }
  const std::string cluster_hash = sha256_hex(cluster_to_json(job.cluster).dump());
  if (cluster_hash != plan.inputs.cluster.sha256) {
    differences.push_back(fmt::format(
        "cluster {} (sha256 {}) vs {} (sha256 {})", plan.inputs.cluster.name,
        short_hash(plan.inputs.cluster.sha256), job.cluster.name, short_hash(cluster_hash)));
  }
  const std::string parallel = parallel_to_json(job.parallel).dump();
  if (parallel != plan.inputs.parallel.dump()) {
    differences.push_back(
        fmt::format("parallel settings {} vs {}", plan.inputs.parallel.dump(), parallel));
  }
  if (differences.empty()) return;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: the plan was made for another job than {}: {} (plan vs job); "
                          "plan this job again with dhelix-plan",
                          plan_file, job_file, join(differences, "; ")));
}

}  // namespace dhelix
