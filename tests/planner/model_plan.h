#pragma once
// How the planner tests plan a job: from the model backend's profile of it (the ops' own
// modelled times for anything the profile lacks), with what each test varies.

#include <cstdint>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"

namespace dhelix::test_jobs {

/// What the tests vary when they plan; the rest is PlanRequest's default.
struct ModelPlanOptions {
  ShapeRequest shape = ShapeRequest::kAuto;
  int64_t virtual_pipeline_size = 0;  ///< 0: the planner's default
  bool allow_oom = true;
  bool split_backward = true;
};

/// build_plan of `job` from make_model_profile's profile of it, with `options`.
inline PlanResult model_plan_result(const JobSpec& job, const ModelPlanOptions& options = {}) {
  const Profile profile = make_model_profile(job, OrderedJson::object());
  PlanRequest request;
  request.job = &job;
  request.profile = &profile;
  request.profile_name = "model";
  request.unprofiled_op_time_us = [&job](const Op& op) { return op_time_us(job.cluster, op); };
  request.allow_oom = options.allow_oom;
  request.shape = options.shape;
  request.virtual_pipeline_size = options.virtual_pipeline_size;
  request.split_backward = options.split_backward;
  return build_plan(request);
}

/// The plan of model_plan_result.
inline Plan model_plan(const JobSpec& job, const ModelPlanOptions& options = {}) {
  return model_plan_result(job, options).plan;
}

}  // namespace dhelix::test_jobs
