#include "planner/combined_1f1b.h"

#include <fmt/format.h>

#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

// A forward and the head-loss step that follows it, if any.
struct ForwardUnit {
  PipelineTask forward;
  bool has_head_loss = false;
  PipelineTask head_loss;
};

PipelineTask paired(const PipelineTask& f, const PipelineTask& b) {
  PipelineTask t = f;
  t.kind = TaskKind::kSiBlock;
  t.backward_micro_batch = b.backward_micro_batch;
  t.backward_chunk = b.backward_chunk;
  t.backward_model_chunk = b.backward_model_chunk;
  return t;
}

std::vector<PipelineTask> combined_stage(const std::vector<PipelineTask>& tasks) {
  std::vector<ForwardUnit> forwards;
  std::vector<PipelineTask> backwards;
  size_t before_first_backward = 0;
  for (const PipelineTask& t : tasks) {
    switch (t.kind) {
      case TaskKind::kForward:
        forwards.push_back({.forward = t, .has_head_loss = false, .head_loss = {}});
        if (backwards.empty()) ++before_first_backward;
        break;
      case TaskKind::kHeadLoss:
        DHELIX_CHECK(!forwards.empty());
        forwards.back().has_head_loss = true;
        forwards.back().head_loss = t;
        break;
      case TaskKind::kBackward:
        DHELIX_CHECK(t.backward_split == BackwardSplit::kWhole);
        backwards.push_back(t);
        break;
      case TaskKind::kSiBlock:
        DHELIX_CHECK(false);
    }
  }
  std::vector<PipelineTask> out;
  const auto emit = [&out](const ForwardUnit& u, const PipelineTask* backward) {
    out.push_back(backward == nullptr ? u.forward : paired(u.forward, *backward));
    if (u.has_head_loss) out.push_back(u.head_loss);
  };
  // The steady state runs a forward, then a backward: the forwards before the first
  // backward are the warm-up and the first steady forward, unless there is no steady state.
  const size_t warm_up = before_first_backward == forwards.size() ? forwards.size()
                         : before_first_backward > 0              ? before_first_backward - 1
                                                                  : 0;
  const size_t first = std::min(warm_up + 1, forwards.size());  // Megatron's extra warm-up
  for (size_t i = 0; i < first; ++i) emit(forwards[i], nullptr);
  size_t next_backward = 0;
  for (size_t i = first; i < forwards.size(); ++i) emit(forwards[i], &backwards[next_backward++]);
  for (; next_backward < backwards.size(); ++next_backward) out.push_back(backwards[next_backward]);
  return out;
}

}  // namespace

bool combined_1f1b_applies(int64_t pp, int64_t virtual_pipeline) {
  return pp == 1 || virtual_pipeline > 1;
}

PipelineSchedule make_combined_1f1b_schedule(const PipelineSchedule& base) {
  if (base.shape != PipelineShape::kOneFOneB && base.shape != PipelineShape::kInterleaved) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("combined 1F1B schedule: the base schedule is {}; it needs 1F1B or "
                            "interleaved 1F1B",
                            pipeline_shape_name(base.shape)));
  }
  PipelineSchedule out = base;
  for (auto& stage : out.stages) stage = combined_stage(stage);
  return out;
}

}  // namespace dhelix
