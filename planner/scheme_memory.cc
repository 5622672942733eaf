#include "planner/scheme_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/int_math.h"
#include "lib/stage_split.h"
#include "planner/folding.h"
#include "planner/pipeline_schedule.h"

namespace dhelix {
namespace {

// Every stage's (first chunk, up chunk) layers in `shape`'s layout, as the plan builder
// counts them: the W's down and up chunks, or 1F1B's one chunk and no up chunk.
std::vector<std::pair<int64_t, int64_t>> stage_chunk_layers(const JobSpec& job,
                                                            PipelineShape shape) {
  const ParallelSpec& p = job.parallel;
  std::vector<std::pair<int64_t, int64_t>> layers;
  if (shape == PipelineShape::kOneFOneB) {
    for (const auto& stage : unfold_job_layers(job.model.num_layers, p).stages) {
      layers.emplace_back(stage.count, 0);
    }
    return layers;
  }
  for (const auto& stage : fold_job_layers(job.model.num_layers, p).stages) {
    layers.emplace_back(stage.down.count, stage.up.count);
  }
  return layers;
}

}  // namespace

void set_chunk_memory(const ModelSpec& model, const ParallelSpec& parallel, int64_t layers,
                      int64_t up_layers, const MemoryOptions& options, StageCosts& costs) {
  const int64_t kept = chunk_activation_bytes(model, parallel, layers, options);
  costs.layers_per_chunk = layers;
  costs.activation_bytes_per_layer = ceil_div(kept, layers);
  if (up_layers > 0 && up_layers != layers) costs.up_layers = up_layers;
  if (parallel.recompute.enabled() || costs.up_layers > 0) {
    costs.chunk_activation_bytes = kept;
    costs.up_chunk_activation_bytes =
        up_layers > 0 ? chunk_activation_bytes(model, parallel, up_layers, options) : kept;
    costs.backward_transient_bytes =
        recompute_transient_bytes(model, parallel, std::max(layers, up_layers), options);
  }
  // All-gather CP's K/V (and in the backward dK/dV) of the whole sequence, in flight during
  // one layer's forward or backward (memory_model.h); the backward's after its recomputed
  // forward, whose gathered K/V are freed by then.
  costs.forward_transient_bytes = cp_forward_transient_bytes(model, parallel);
  costs.backward_transient_bytes += cp_backward_transient_bytes(model, parallel);
}

void set_model_chunk_memory(const ModelSpec& model, const ParallelSpec& parallel,
                            const std::vector<int64_t>& layers, const MemoryOptions& options,
                            StageCosts& costs) {
  if (std::adjacent_find(layers.begin(), layers.end(), std::not_equal_to<>()) == layers.end()) {
    return;  // equal chunks: layers_per_chunk says it all
  }
  costs.model_chunk_layers = layers;
  costs.model_chunk_activation_bytes.clear();
  for (int64_t n : layers) {
    costs.model_chunk_activation_bytes.push_back(
        chunk_activation_bytes(model, parallel, n, options));
  }
}

std::vector<StageMemory> scheme_memory(const JobSpec& job, PipelineScheme scheme,
                                       const MemoryOptions& options) {
  DHELIX_CHECK(scheme == PipelineScheme::kDHelix || scheme == PipelineScheme::kMegatron1F1B);
  const ParallelSpec& p = job.parallel;
  return schedule_memory(job, make_schedule(scheme_shape(scheme), p.pp, p.num_micro_batches()),
                         options);
}

namespace {

// Interleaved stages (the dhelix plan's third shape): each stage's model chunks' layers, as
// the plan builder splits them (lib/stage_split.h).
std::vector<StageCosts> interleaved_chunk_costs(const JobSpec& job, int64_t v,
                                                const MemoryOptions& options) {
  const ParallelSpec& p = job.parallel;
  std::string why;
  const auto chunks = interleaved_stage_layers(job.model.num_layers, p, v, why);
  if (!chunks) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("interleaved stages with {} model chunks each: {}", v, why));
  }
  std::vector<StageCosts> costs;
  for (const std::vector<int64_t>& layers : *chunks) {
    StageCosts c;
    c.head_loss_transient_bytes = head_loss_transient_bytes(job.model, p);
    set_chunk_memory(job.model, p, *std::max_element(layers.begin(), layers.end()), 0, options, c);
    set_model_chunk_memory(job.model, p, layers, options, c);
    costs.push_back(c);
  }
  return costs;
}

}  // namespace

std::vector<StageMemory> schedule_memory(const JobSpec& job, const PipelineSchedule& schedule,
                                         const MemoryOptions& options) {
  const ParallelSpec& p = job.parallel;
  if (schedule.shape == PipelineShape::kInterleaved) {
    const std::vector<StageCosts> costs =
        interleaved_chunk_costs(job, schedule.model_chunks, options);
    return stage_memory(job.model, p, schedule.shape, options, activation_peaks(schedule, costs));
  }
  std::vector<StageCosts> costs;
  for (const auto& [layers, up_layers] : stage_chunk_layers(job, schedule.shape)) {
    StageCosts c;
    c.head_loss_transient_bytes = head_loss_transient_bytes(job.model, p);
    set_chunk_memory(job.model, p, layers, up_layers, options, c);
    costs.push_back(c);
  }
  return stage_memory(job.model, p, schedule.shape, options, activation_peaks(schedule, costs));
}

namespace {

PipelineTask task_of(const PlanTask& t, ChunkSide last_chunk, int64_t model_chunks) {
  PipelineTask task;
  task.kind = t.kind;
  task.numbered_chunks = model_chunks > 1;
  if (t.kind == TaskKind::kHeadLoss) {
    task.forward_micro_batch = task.backward_micro_batch = t.head_loss_micro_batch;
    task.forward_chunk = task.backward_chunk = last_chunk;
    task.forward_model_chunk = task.backward_model_chunk = model_chunks - 1;
    return task;
  }
  if (t.forward) {
    task.forward_micro_batch = t.forward->micro_batch;
    task.forward_chunk = t.forward->chunk;
    task.forward_model_chunk = t.forward->model_chunk.value_or(0);
  }
  if (t.backward) {
    task.backward_micro_batch = t.backward->micro_batch;
    task.backward_chunk = t.backward->chunk;
    task.backward_split = backward_split(t.backward->work);
    task.backward_model_chunk = t.backward->model_chunk.value_or(0);
  }
  return task;
}

}  // namespace

PipelineSchedule schedule_of_plan(const Plan& plan) {
  PipelineSchedule schedule;
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  schedule.shape = dhelix != nullptr ? dhelix->shape : PipelineShape::kW;
  schedule.pp = static_cast<int64_t>(plan.stages.size());
  schedule.num_micro_batches = plan.num_micro_batches;
  const bool folded = folded_shape(schedule.shape);
  schedule.embedding_stage = 0;
  schedule.head_loss_stage = folded ? 0 : schedule.pp - 1;
  schedule.first_chunk = folded ? ChunkSide::kDown : ChunkSide::kWhole;
  schedule.last_chunk = folded ? ChunkSide::kUp : ChunkSide::kWhole;
  if (!plan.stages.empty() && !plan.stages.front().model_chunks.empty()) {
    schedule.model_chunks = static_cast<int64_t>(plan.stages.front().model_chunks.size());
  }
  for (const PlanStage& stage : plan.stages) {
    std::vector<PipelineTask>& tasks = schedule.stages.emplace_back();
    for (const PlanTask& t : stage.tasks) {
      tasks.push_back(task_of(t, schedule.last_chunk, schedule.model_chunks));
    }
  }
  return schedule;
}

}  // namespace dhelix
