#include "planner/plan_stage_records.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace dhelix {
namespace {

using WorkKey = std::tuple<int, int64_t, int, int64_t, int64_t>;

WorkKey work_key(const WorkItem& w) {
  return {static_cast<int>(w.pass), w.micro_batch, static_cast<int>(w.chunk), w.stage,
          w.model_chunk};
}

bool interleaved(const StageRecordInputs& in) {
  return in.schedule.shape == PipelineShape::kInterleaved;
}

// Interleaved stages: each stage's model chunks, chunk c of stage p holding virtual stage
// c·pp + p, the virtual stages in layer order.
std::vector<std::vector<PlanLayerRange>> model_chunk_ranges(const StageRecordInputs& in) {
  const int64_t pp = in.schedule.pp;
  const int64_t v = in.schedule.model_chunks;
  std::vector<std::vector<PlanLayerRange>> out(static_cast<size_t>(pp));
  int64_t first = 0;
  for (int64_t k = 0; k < pp * v; ++k) {
    const size_t p = static_cast<size_t>(k % pp);
    const int64_t count = in.model_chunk_layers != nullptr && !in.model_chunk_layers->empty()
                              ? (*in.model_chunk_layers)[p][static_cast<size_t>(k / pp)]
                              : in.unfolded.stages[p].count / v;
    out[p].push_back({first, count});
    first += count;
  }
  return out;
}

PlanLayerRange chunk_layers(const StageRecordInputs& in, int64_t stage, ChunkSide side) {
  const auto range = [](const LayerRange& r) { return PlanLayerRange{r.first, r.count}; };
  const size_t s = static_cast<size_t>(stage);
  switch (side) {
    case ChunkSide::kDown:
      return range(in.folded.stages[s].down);
    case ChunkSide::kUp:
      return range(in.folded.stages[s].up);
    case ChunkSide::kWhole:
      return range(in.unfolded.stages[s]);
  }
  return {};
}

PlanTaskPart task_part(const StageRecordInputs& in, const std::vector<PlanLayerRange>& chunks,
                       int64_t stage, int64_t micro_batch, ChunkSide side, int64_t model_chunk) {
  PlanTaskPart part;
  part.micro_batch = micro_batch;
  part.chunk = side;
  if (interleaved(in)) {
    part.layers = chunks.at(static_cast<size_t>(model_chunk));
    part.model_chunk = model_chunk;
  } else {
    part.layers = chunk_layers(in, stage, side);
  }
  return part;
}

PlanTask task_record(const StageRecordInputs& in, int64_t stage, int64_t index,
                     const std::vector<PlanLayerRange>& chunks,
                     const std::map<WorkKey, PlanTaskRef>& producer) {
  const PipelineTask& task =
      in.schedule.stages[static_cast<size_t>(stage)][static_cast<size_t>(index)];
  const TimelineEntry& entry =
      in.simulation.stages[static_cast<size_t>(stage)].timeline[static_cast<size_t>(index)];
  PlanTask t;
  t.index = index;
  t.kind = task.kind;
  t.label = task.label();
  t.start_us = entry.start_us;
  t.end_us = entry.end_us;
  if (task.has_forward()) {
    t.forward = task_part(in, chunks, stage, task.forward_micro_batch, task.forward_chunk,
                          task.forward_model_chunk);
  }
  if (task.has_backward()) {
    t.backward = task_part(in, chunks, stage, task.backward_micro_batch, task.backward_chunk,
                           task.backward_model_chunk);
    t.backward->work = backward_share(task.backward_split);
  }
  if (task.kind == TaskKind::kHeadLoss) t.head_loss_micro_batch = task.forward_micro_batch;
  for (const WorkItem& w : task_work(task, stage)) {
    for (const WorkItem& input : work_inputs(in.schedule, w)) {
      if (input.stage == stage) continue;
      const PlanTaskRef ref = producer.at(work_key(input));
      const bool seen = std::any_of(
          t.waits_for.begin(), t.waits_for.end(),
          [&](const PlanTaskRef& r) { return r.stage == ref.stage && r.task == ref.task; });
      if (!seen) t.waits_for.push_back(ref);
    }
  }
  return t;
}

}  // namespace

std::vector<PlanStage> stage_records(const StageRecordInputs& in) {
  std::map<WorkKey, PlanTaskRef> producer;
  const int64_t pp = static_cast<int64_t>(in.schedule.stages.size());
  for (int64_t s = 0; s < pp; ++s) {
    const auto& tasks = in.schedule.stages[static_cast<size_t>(s)];
    for (size_t i = 0; i < tasks.size(); ++i) {
      for (const WorkItem& w : task_work(tasks[i], s)) {
        producer[work_key(w)] = {.stage = s, .task = static_cast<int64_t>(i)};
      }
    }
  }
  const std::vector<std::vector<PlanLayerRange>> chunks =
      interleaved(in) ? model_chunk_ranges(in)
                      : std::vector<std::vector<PlanLayerRange>>(static_cast<size_t>(pp));
  std::vector<PlanStage> out;
  for (int64_t s = 0; s < pp; ++s) {
    PlanStage stage;
    stage.stage = s;
    for (int64_t r = 0; r < in.placement.world_size(); ++r) {
      if (in.placement.coordinates(r).pp == s) stage.ranks.push_back(r);
    }
    stage.shape_rank = in.shape_ranks[static_cast<size_t>(s)];
    stage.pairing = in.pairing_of_stage[static_cast<size_t>(s)];
    const std::vector<PlanLayerRange>& stage_chunks = chunks[static_cast<size_t>(s)];
    if (interleaved(in)) {
      stage.model_chunks = stage_chunks;  // down_layers and up_layers stay empty
    } else {
      stage.down_layers = chunk_layers(in, s, ChunkSide::kDown);
      stage.up_layers = chunk_layers(in, s, ChunkSide::kUp);
    }
    stage.embedding = s == in.schedule.embedding_stage;
    stage.head_loss = s == in.schedule.head_loss_stage;
    const int64_t n = static_cast<int64_t>(in.schedule.stages[static_cast<size_t>(s)].size());
    for (int64_t i = 0; i < n; ++i) {
      stage.tasks.push_back(task_record(in, s, i, stage_chunks, producer));
    }
    stage.phases = in.phases[static_cast<size_t>(s)];
    out.push_back(std::move(stage));
  }
  return out;
}

}  // namespace dhelix
