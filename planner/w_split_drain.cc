#include "planner/w_split_drain.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "lib/error.h"

namespace dhelix {
namespace {

bool lone_whole_backward(const PipelineTask& task) {
  return task.kind == TaskKind::kBackward && task.backward_split == BackwardSplit::kWhole;
}

PipelineTask with_split(PipelineTask task, BackwardSplit split) {
  task.backward_split = split;
  return task;
}

// Step 1: each lone backward becomes I; its W goes to the end of the stage, in I order.
PipelineSchedule most_deferred(const PipelineSchedule& w) {
  PipelineSchedule out = w;
  for (std::vector<PipelineTask>& tasks : out.stages) {
    std::vector<PipelineTask> weights;
    for (PipelineTask& task : tasks) {
      if (!lone_whole_backward(task)) continue;
      weights.push_back(with_split(task, BackwardSplit::kWeight));
      task.backward_split = BackwardSplit::kInput;
    }
    tasks.insert(tasks.end(), weights.begin(), weights.end());
  }
  return out;
}

// Steps 2 and 3 on one stage: `deferred` is the stage's list from step 1 and `timeline` its
// simulation (same order).
std::vector<PipelineTask> fill_stage(const std::vector<PipelineTask>& deferred,
                                     const std::vector<TimelineEntry>& timeline,
                                     int64_t max_deferred) {
  DHELIX_CHECK(deferred.size() == timeline.size());
  // The W sit at the end of the stage, in the order of their I.
  size_t first_weight = deferred.size();
  while (first_weight > 0 && deferred[first_weight - 1].backward_split == BackwardSplit::kWeight) {
    --first_weight;
  }
  std::deque<std::pair<PipelineTask, double>> pending;
  std::vector<PipelineTask> out;
  size_t next_weight = first_weight;
  double previous_end = 0;
  for (size_t i = 0; i < first_weight; ++i) {
    const TimelineEntry& entry = timeline[i];
    double idle = entry.start_us - previous_end;
    while (!pending.empty() && pending.front().second <= idle) {
      idle -= pending.front().second;
      out.push_back(pending.front().first);
      pending.pop_front();
    }
    out.push_back(deferred[i]);
    previous_end = entry.end_us;
    if (deferred[i].backward_split != BackwardSplit::kInput) continue;
    DHELIX_CHECK(next_weight < deferred.size());
    const TimelineEntry& weight = timeline[next_weight];
    pending.emplace_back(deferred[next_weight], weight.end_us - weight.start_us);
    ++next_weight;
    if (static_cast<int64_t>(pending.size()) > max_deferred) {
      out.push_back(pending.front().first);
      pending.pop_front();
    }
  }
  for (const auto& [task, duration] : pending) out.push_back(task);
  return out;
}

}  // namespace

PipelineSchedule split_w_drain(const PipelineSchedule& w, const std::vector<StageCosts>& costs,
                               int64_t max_deferred) {
  if (w.shape != PipelineShape::kW) {
    throw Error(ErrorCode::kInvalidInput, "split_w_drain: the schedule is not a W");
  }
  const PipelineSchedule deferred = most_deferred(w);
  const PipelineSimulation simulation = simulate_pipeline(deferred, costs);
  PipelineSchedule out = deferred;
  for (size_t s = 0; s < out.stages.size(); ++s) {
    out.stages[s] = fill_stage(deferred.stages[s], simulation.stages[s].timeline,
                               std::max<int64_t>(max_deferred, 0));
  }
  return out;
}

int64_t weight_gradient_tasks(const PipelineSchedule& schedule) {
  int64_t count = 0;
  for (const std::vector<PipelineTask>& tasks : schedule.stages) {
    for (const PipelineTask& task : tasks) {
      count += task.kind == TaskKind::kBackward && task.backward_split == BackwardSplit::kWeight;
    }
  }
  return count;
}

}  // namespace dhelix
