#include "planner/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "lib/error.h"

namespace dhelix {

bool folded_shape(PipelineShape shape) {
  return shape == PipelineShape::kW || shape == PipelineShape::kV;
}

PipelineShape scheme_shape(PipelineScheme scheme) {
  switch (scheme) {
    case PipelineScheme::kMegatron1F1B:
    case PipelineScheme::kIntraBatch:
    case PipelineScheme::kZeroBubbleH1:
      return PipelineShape::kOneFOneB;
    case PipelineScheme::kWaveletPlus:
    case PipelineScheme::kDHelix:
      return PipelineShape::kW;
    case PipelineScheme::kMegatronInterleaved:
    case PipelineScheme::kMegatronA2aOverlap:
      return PipelineShape::kInterleaved;
    case PipelineScheme::kZeroBubbleV:
    case PipelineScheme::kDualPipeV:
    case PipelineScheme::kDualPipeVHandwritten:
      return PipelineShape::kV;
  }
  return PipelineShape::kW;
}

namespace {

// "d", "u" or "" (whole chunk) after a micro-batch number in a label.
const char* chunk_suffix(ChunkSide side) {
  switch (side) {
    case ChunkSide::kDown:
      return "d";
    case ChunkSide::kUp:
      return "u";
    case ChunkSide::kWhole:
      return "";
  }
  return "?";
}

PipelineTask forward_task(int64_t mb, ChunkSide chunk) {
  PipelineTask task;
  task.kind = TaskKind::kForward;
  task.forward_micro_batch = mb;
  task.forward_chunk = chunk;
  return task;
}

PipelineTask backward_task(int64_t mb, ChunkSide chunk) {
  PipelineTask task;
  task.kind = TaskKind::kBackward;
  task.backward_micro_batch = mb;
  task.backward_chunk = chunk;
  return task;
}

PipelineTask head_loss_task(int64_t mb, ChunkSide last_chunk) {
  PipelineTask task;
  task.kind = TaskKind::kHeadLoss;
  task.forward_micro_batch = mb;
  task.backward_micro_batch = mb;
  task.forward_chunk = last_chunk;
  task.backward_chunk = last_chunk;
  return task;
}

// The forward of `forward_mb` (when it exists, 0 <= mb < m) with the backward of
// `backward_mb` (likewise): an SI block, a lone half, or nothing.
std::optional<PipelineTask> paired_task(int64_t m, int64_t forward_mb, ChunkSide forward_chunk,
                                        int64_t backward_mb, ChunkSide backward_chunk) {
  const bool has_forward = forward_mb >= 0 && forward_mb < m;
  const bool has_backward = backward_mb >= 0 && backward_mb < m;
  if (has_forward && has_backward) {
    PipelineTask task = forward_task(forward_mb, forward_chunk);
    task.kind = TaskKind::kSiBlock;
    task.backward_micro_batch = backward_mb;
    task.backward_chunk = backward_chunk;
    return task;
  }
  if (has_forward) return forward_task(forward_mb, forward_chunk);
  if (has_backward) return backward_task(backward_mb, backward_chunk);
  return std::nullopt;
}

void check_schedule_sizes(int64_t pp, int64_t m) {
  if (pp < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("pp = {}: a pipeline needs at least one stage", pp));
  }
  if (m < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("micro-batches = {}: a pipeline needs at least one micro-batch", m));
  }
}

// One stage of the W: the two slot series of the header essay merged by slot; the
// head-loss step goes right after forward(j, up) on stage 0 (odd sort key = half a slot).
std::vector<PipelineTask> w_stage_tasks(int64_t pp, int64_t m, int64_t p) {
  std::vector<std::pair<int64_t, PipelineTask>> keyed;
  for (int64_t j = 0; j < m + pp; ++j) {
    if (auto down = paired_task(m, j, ChunkSide::kDown, j - pp, ChunkSide::kUp)) {
      keyed.emplace_back(2 * (p + 2 * j), *down);
    }
    const int64_t up_slot = 2 * pp - 1 - p + 2 * j;
    if (auto up = paired_task(m, j, ChunkSide::kUp, j - pp, ChunkSide::kDown)) {
      keyed.emplace_back(2 * up_slot, *up);
    }
    if (p == 0 && j < m) keyed.emplace_back(2 * up_slot + 1, head_loss_task(j, ChunkSide::kUp));
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PipelineTask> tasks;
  for (auto& [key, task] : keyed) tasks.push_back(task);
  return tasks;
}

std::vector<PipelineTask> one_f_one_b_stage_tasks(int64_t pp, int64_t m, int64_t p) {
  const bool last = p == pp - 1;
  const int64_t warmup = std::min(pp - 1 - p, m);
  std::vector<PipelineTask> tasks;
  for (int64_t i = 0; i < warmup; ++i) tasks.push_back(forward_task(i, ChunkSide::kWhole));
  for (int64_t i = 0; i < m - warmup; ++i) {
    tasks.push_back(forward_task(warmup + i, ChunkSide::kWhole));
    if (last) tasks.push_back(head_loss_task(warmup + i, ChunkSide::kWhole));
    tasks.push_back(backward_task(i, ChunkSide::kWhole));
  }
  for (int64_t i = m - warmup; i < m; ++i) tasks.push_back(backward_task(i, ChunkSide::kWhole));
  return tasks;
}

}  // namespace

namespace {

// ".c" after an interleaved chunk's micro-batch; nothing for other shapes.
std::string model_chunk_suffix(const PipelineTask& task, int64_t chunk) {
  return task.numbered_chunks ? fmt::format(".{}", chunk) : "";
}

const char* backward_letter(BackwardSplit split) {
  switch (split) {
    case BackwardSplit::kWhole:
      return "B";
    case BackwardSplit::kInput:
      return "I";
    case BackwardSplit::kWeight:
      return "W";
  }
  return "?";
}

}  // namespace

std::string PipelineTask::label() const {
  const std::string forward =
      fmt::format("F{}{}{}", forward_micro_batch, chunk_suffix(forward_chunk),
                  model_chunk_suffix(*this, forward_model_chunk));
  const std::string backward =
      fmt::format("{}{}{}{}", backward_letter(backward_split), backward_micro_batch,
                  chunk_suffix(backward_chunk), model_chunk_suffix(*this, backward_model_chunk));
  switch (kind) {
    case TaskKind::kForward:
      return forward;
    case TaskKind::kBackward:
      return backward;
    case TaskKind::kSiBlock:
      return forward + "+" + backward;
    case TaskKind::kHeadLoss:
      return fmt::format("H{}", forward_micro_batch);
  }
  return "?";
}

int64_t PipelineSchedule::si_block_count(int64_t stage) const {
  const auto& tasks = stages.at(static_cast<size_t>(stage));
  return std::count_if(tasks.begin(), tasks.end(),
                       [](const PipelineTask& t) { return t.kind == TaskKind::kSiBlock; });
}

BackwardShare backward_share(BackwardSplit split) {
  switch (split) {
    case BackwardSplit::kInput:
      return BackwardShare::kInput;
    case BackwardSplit::kWeight:
      return BackwardShare::kWeight;
    case BackwardSplit::kWhole:
      break;
  }
  return BackwardShare::kWhole;
}

BackwardSplit backward_split(BackwardShare share) {
  switch (share) {
    case BackwardShare::kInput:
      return BackwardSplit::kInput;
    case BackwardShare::kWeight:
      return BackwardSplit::kWeight;
    case BackwardShare::kWhole:
      break;
  }
  return BackwardSplit::kWhole;
}

PipelineSchedule make_w_schedule(int64_t pp, int64_t num_micro_batches) {
  check_schedule_sizes(pp, num_micro_batches);
  PipelineSchedule schedule;
  schedule.shape = PipelineShape::kW;
  schedule.pp = pp;
  schedule.num_micro_batches = num_micro_batches;
  schedule.embedding_stage = 0;
  schedule.head_loss_stage = 0;
  schedule.first_chunk = ChunkSide::kDown;
  schedule.last_chunk = ChunkSide::kUp;
  for (int64_t p = 0; p < pp; ++p) {
    schedule.stages.push_back(w_stage_tasks(pp, num_micro_batches, p));
  }
  return schedule;
}

PipelineSchedule make_one_f_one_b_schedule(int64_t pp, int64_t num_micro_batches) {
  check_schedule_sizes(pp, num_micro_batches);
  PipelineSchedule schedule;
  schedule.shape = PipelineShape::kOneFOneB;
  schedule.pp = pp;
  schedule.num_micro_batches = num_micro_batches;
  schedule.embedding_stage = 0;
  schedule.head_loss_stage = pp - 1;
  schedule.first_chunk = ChunkSide::kWhole;
  schedule.last_chunk = ChunkSide::kWhole;
  for (int64_t p = 0; p < pp; ++p) {
    schedule.stages.push_back(one_f_one_b_stage_tasks(pp, num_micro_batches, p));
  }
  return schedule;
}

PipelineSchedule make_schedule(PipelineShape shape, int64_t pp, int64_t num_micro_batches) {
  switch (shape) {
    case PipelineShape::kW:
      return make_w_schedule(pp, num_micro_batches);
    case PipelineShape::kOneFOneB:
      return make_one_f_one_b_schedule(pp, num_micro_batches);
    case PipelineShape::kInterleaved:
    case PipelineShape::kV:
      break;
  }
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("make_schedule: the {} shape needs its scheme's generator "
                          "(baseline_schedules.h)",
                          pipeline_shape_name(shape)));
}

std::vector<WorkItem> task_work(const PipelineTask& task, int64_t stage) {
  if (task.kind == TaskKind::kHeadLoss) {
    return {WorkItem{WorkPass::kHeadLoss, task.forward_micro_batch, task.forward_chunk, stage,
                     task.forward_model_chunk}};
  }
  std::vector<WorkItem> items;
  if (task.has_forward()) {
    items.push_back(WorkItem{WorkPass::kForward, task.forward_micro_batch, task.forward_chunk,
                             stage, task.forward_model_chunk});
  }
  if (task.has_backward()) {
    const WorkPass pass =
        task.backward_split == BackwardSplit::kWeight ? WorkPass::kWeightGrad : WorkPass::kBackward;
    items.push_back(WorkItem{pass, task.backward_micro_batch, task.backward_chunk, stage,
                             task.backward_model_chunk});
  }
  return items;
}

namespace {

std::vector<WorkItem> w_inputs(const PipelineSchedule& s, const WorkItem& item) {
  const int64_t mb = item.micro_batch;
  const int64_t p = item.stage;
  const int64_t last = s.pp - 1;
  switch (item.pass) {
    case WorkPass::kForward:
      if (item.chunk == ChunkSide::kDown) {
        if (p == 0) return {};
        return {WorkItem{WorkPass::kForward, mb, ChunkSide::kDown, p - 1}};
      }
      if (p == last) return {WorkItem{WorkPass::kForward, mb, ChunkSide::kDown, p}};
      return {WorkItem{WorkPass::kForward, mb, ChunkSide::kUp, p + 1}};
    case WorkPass::kHeadLoss:
      return {WorkItem{WorkPass::kForward, mb, ChunkSide::kUp, 0}};
    case WorkPass::kBackward: {
      const WorkItem own{WorkPass::kForward, mb, item.chunk, p};
      if (item.chunk == ChunkSide::kUp) {
        if (p == 0) return {WorkItem{WorkPass::kHeadLoss, mb, ChunkSide::kUp, 0}, own};
        return {WorkItem{WorkPass::kBackward, mb, ChunkSide::kUp, p - 1}, own};
      }
      if (p == last) return {WorkItem{WorkPass::kBackward, mb, ChunkSide::kUp, p}, own};
      return {WorkItem{WorkPass::kBackward, mb, ChunkSide::kDown, p + 1}, own};
    }
    case WorkPass::kWeightGrad:
      return {WorkItem{WorkPass::kBackward, mb, item.chunk, p}};
  }
  return {};
}

std::vector<WorkItem> one_f_one_b_inputs(const PipelineSchedule& s, const WorkItem& item) {
  const int64_t mb = item.micro_batch;
  const int64_t p = item.stage;
  const int64_t last = s.pp - 1;
  switch (item.pass) {
    case WorkPass::kForward:
      if (p == 0) return {};
      return {WorkItem{WorkPass::kForward, mb, ChunkSide::kWhole, p - 1}};
    case WorkPass::kHeadLoss:
      return {WorkItem{WorkPass::kForward, mb, ChunkSide::kWhole, last}};
    case WorkPass::kBackward: {
      const WorkItem own{WorkPass::kForward, mb, ChunkSide::kWhole, p};
      if (p == last) return {WorkItem{WorkPass::kHeadLoss, mb, ChunkSide::kWhole, p}, own};
      return {WorkItem{WorkPass::kBackward, mb, ChunkSide::kWhole, p + 1}, own};
    }
    case WorkPass::kWeightGrad:
      return {WorkItem{WorkPass::kBackward, mb, ChunkSide::kWhole, p}};
  }
  return {};
}

// Interleaved: chunk c of stage p is virtual stage c·pp + p; the forward walks the virtual
// stages upwards, the backward downwards, the head-loss step follows the last one.
std::vector<WorkItem> interleaved_inputs(const PipelineSchedule& s, const WorkItem& item) {
  const int64_t mb = item.micro_batch;
  const int64_t virtual_stage = item.model_chunk * s.pp + item.stage;
  const int64_t last = s.model_chunks * s.pp - 1;
  const auto at = [&](WorkPass pass, int64_t v) {
    return WorkItem{pass, mb, ChunkSide::kWhole, v % s.pp, v / s.pp};
  };
  switch (item.pass) {
    case WorkPass::kForward:
      if (virtual_stage == 0) return {};
      return {at(WorkPass::kForward, virtual_stage - 1)};
    case WorkPass::kHeadLoss:
      return {at(WorkPass::kForward, last)};
    case WorkPass::kBackward: {
      const WorkItem own = at(WorkPass::kForward, virtual_stage);
      if (virtual_stage == last) return {at(WorkPass::kHeadLoss, last), own};
      return {at(WorkPass::kBackward, virtual_stage + 1), own};
    }
    case WorkPass::kWeightGrad:
      return {at(WorkPass::kBackward, virtual_stage)};
  }
  return {};
}

}  // namespace

std::vector<WorkItem> work_inputs(const PipelineSchedule& schedule, const WorkItem& item) {
  switch (schedule.shape) {
    case PipelineShape::kW:
    case PipelineShape::kV:
      return w_inputs(schedule, item);
    case PipelineShape::kOneFOneB:
      return one_f_one_b_inputs(schedule, item);
    case PipelineShape::kInterleaved:
      return interleaved_inputs(schedule, item);
  }
  return {};
}

}  // namespace dhelix
