#pragma once
// Test helper: turns a plan's lone backward tasks into split ones, the shape the zero-bubble
// schedules give a stage (an input part I where the backward was, its weight part W later):
// each task of kind backward becomes "I<mb><chunk>", and its "W<mb><chunk>" follows
// `defer` tasks of the original list later (at the stage's end when fewer are left). Task
// indices are renumbered and every stage's waits_for follows them, so the plan stays what
// the checker accepts (check 10: waits_for names the producing tasks; a W produces no
// transfer). tests/e2e/split_backward.py does the same on a plan file.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/plan/plan.h"

namespace dhelix::testing {

inline void split_lone_backwards(Plan& plan, int64_t defer) {
  plan.schema_version = plan_schema_version(plan.options);  // "work" needs 1.3.0
  std::vector<std::map<int64_t, int64_t>> renumbered(plan.stages.size());
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    std::vector<PlanTask>& tasks = plan.stages[s].tasks;
    // pending[k]: W tasks to insert after original task k.
    std::map<int64_t, std::vector<PlanTask>> pending;
    const auto last = static_cast<int64_t>(tasks.size()) - 1;
    for (PlanTask& task : tasks) {
      if (task.kind != TaskKind::kBackward || !task.backward ||
          task.backward->work != BackwardShare::kWhole) {
        continue;
      }
      PlanTask weight = task;
      const std::string suffix = task.label.substr(1);
      task.label = "I" + suffix;
      task.backward->work = BackwardShare::kInput;
      weight.label = "W" + suffix;
      weight.backward->work = BackwardShare::kWeight;
      weight.waits_for.clear();  // a W reads only its own stage's I
      weight.start_us = weight.end_us;
      pending[std::min(task.index + defer, last)].push_back(std::move(weight));
    }
    std::vector<PlanTask> out;
    for (PlanTask& task : tasks) {
      const int64_t old = task.index;
      renumbered[s][old] = static_cast<int64_t>(out.size());
      out.push_back(std::move(task));
      for (PlanTask& weight : pending[old]) out.push_back(std::move(weight));
    }
    for (size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int64_t>(i);
    tasks = std::move(out);
  }
  for (PlanStage& stage : plan.stages) {
    for (PlanTask& task : stage.tasks) {
      for (PlanTaskRef& ref : task.waits_for) {
        ref.task = renumbered[static_cast<size_t>(ref.stage)].at(ref.task);
      }
    }
  }
}

}  // namespace dhelix::testing
