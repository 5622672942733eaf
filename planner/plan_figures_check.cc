#include "planner/plan_figures_check.h"

#include <fmt/format.h>

#include <vector>

#include "planner/memory_model.h"
#include "planner/plan_builder.h"
#include "planner/scheme_memory.h"

namespace dhelix {
namespace {

constexpr const char* kRecomputed = "recomputed from the plan's own /job";

void compare(const std::string& plan_file, const std::string& pointer, int64_t in_file,
             int64_t recomputed, ProblemList& problems) {
  if (in_file == recomputed) return;
  problems.add(plan_file, pointer, std::to_string(in_file),
               fmt::format("differs from {} bytes {} (the plan was edited or corrupted; plan the "
                           "job again)",
                           recomputed, kRecomputed));
}

// The recomputed memory of `scheme`: dhelix's from the plan's own task lists (its shape and
// split, planner/dhelix_shapes.h), Megatron-1F1B's from its schedule.
std::vector<StageMemory> recomputed_memory(const Plan& plan, PipelineScheme scheme,
                                           const JobSpec& job, const MemoryOptions& options) {
  if (scheme == PipelineScheme::kDHelix) {
    return schedule_memory(job, schedule_of_plan(plan), options);
  }
  return scheme_memory(job, scheme, options);
}

void compare_scheme(const Plan& plan, PipelineScheme scheme, const JobSpec& job,
                    const MemoryOptions& options, const std::string& plan_file,
                    ProblemList& problems) {
  const PlanScheme* record = plan.find_scheme(scheme);
  if (record == nullptr) return;  // the dhelix scheme's absence is check 5's problem
  const auto index = static_cast<size_t>(record - plan.schemes.data());
  const std::vector<StageMemory> stages = recomputed_memory(plan, scheme, job, options);
  const std::string base = fmt::format("/schemes/{}/memory", index);
  if (record->memory.size() != stages.size()) {
    problems.add(
        plan_file, base, fmt::format("{} stages", record->memory.size()),
        fmt::format("must have one entry per pipeline stage: {} {}", stages.size(), kRecomputed));
    return;
  }
  for (size_t s = 0; s < stages.size(); ++s) {
    const PlanStageMemory& m = record->memory[s];
    const StageMemory& r = stages[s];
    const std::string at = fmt::format("{}/{}/", base, s);
    if (m.stage != r.stage) {
      problems.add(plan_file, at + "stage", std::to_string(m.stage),
                   fmt::format("differs from stage {} {}", r.stage, kRecomputed));
    }
    compare(plan_file, at + "weight_bytes", m.weight_bytes, r.weight_bytes, problems);
    compare(plan_file, at + "gradient_bytes", m.gradient_bytes, r.gradient_bytes, problems);
    compare(plan_file, at + "optimizer_bytes", m.optimizer_bytes, r.optimizer_bytes, problems);
    compare(plan_file, at + "activation_bytes", m.activation_bytes, r.activation_bytes, problems);
    compare(plan_file, at + "total_bytes", m.total_bytes, r.total_bytes(), problems);
  }
}

}  // namespace

void check_plan_memory_figures(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                               ProblemList& problems) {
  MemoryOptions options = PlanRequest{}.memory;  // what dhelix-plan plans with
  options.distributed_optimizer = plan.options.distributed_optimizer;
  const MemoryBudget budget = memory_budget(job.cluster.gpu, options);
  const PlanMemoryBudget& b = plan.memory_budget;
  if (b.gpu != budget.gpu_name) {
    problems.add(plan_file, "/memory_budget/gpu", fmt::format("\"{}\"", b.gpu),
                 fmt::format("differs from \"{}\", the GPU of the plan's own /job/cluster",
                             budget.gpu_name));
  }
  compare(plan_file, "/memory_budget/capacity_bytes", b.capacity_bytes, budget.capacity_bytes,
          problems);
  compare(plan_file, "/memory_budget/reserve_bytes", b.reserve_bytes, budget.reserve_bytes,
          problems);
  compare(plan_file, "/memory_budget/usable_bytes", b.usable_bytes, budget.usable_bytes(),
          problems);
  compare_scheme(plan, PipelineScheme::kDHelix, job, options, plan_file, problems);
  compare_scheme(plan, PipelineScheme::kMegatron1F1B, job, options, plan_file, problems);
  // The dhelix scheme's fits flag against the recomputed figures.
  if (const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix)) {
    bool fits = true;
    for (const StageMemory& m : recomputed_memory(plan, PipelineScheme::kDHelix, job, options)) {
      fits = fits && m.total_bytes() <= budget.usable_bytes();
    }
    if (dhelix->fits != fits) {
      const auto index = static_cast<size_t>(dhelix - plan.schemes.data());
      problems.add(plan_file, fmt::format("/schemes/{}/fits", index),
                   dhelix->fits ? "true" : "false",
                   fmt::format("differs from {} {} (every stage within {} usable bytes)",
                               fits ? "true" : "false", kRecomputed, budget.usable_bytes()));
    }
  }
}

}  // namespace dhelix
