#pragma once
// A shipped example plan (examples/plans/NAME.json) and the job it carries, for the
// runtime tests that run whole programs of it.

#include <string>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix::rt {

struct PlannedJob {
  Plan plan;
  JobSpec job;
};

inline PlannedJob shipped(const std::string& name) {
  PlannedJob p;
  p.plan = read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json");
  p.job = job_from_plan(p.plan, name);
  return p;
}

}  // namespace dhelix::rt
