#pragma once
// A job planned in the test's own process, as `dhelix-plan JOB -o PLAN` plans it without
// --profile (the analytic model's op times), written to text and read back as dhelix-run
// reads a plan file: for simulated runs of jobs no example ships (a shared expert, CP with
// MoE).

#include <string>

#include "lib/plan/plan.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/plan_writer.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"

namespace dhelix::cuda::testing {

/// `job` planned and read back; `file` names the plan in errors.
inline Plan plan_in_process(const JobSpec& job, const std::string& file) {
  const Profile profile = make_model_profile(job, OrderedJson::object());
  PlanRequest request;
  request.job = &job;
  request.profile = &profile;
  request.profile_name = "the generated model profile";
  request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  const ClusterSpec cluster = job.cluster;
  request.unprofiled_op_time_us = [cluster](const Op& op) { return op_time_us(cluster, op); };
  return plan_from_json(Json::parse(plan_to_text(build_plan(request).plan)), file);
}

}  // namespace dhelix::cuda::testing
