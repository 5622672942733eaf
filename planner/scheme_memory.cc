#include "planner/scheme_memory.h"

#include <algorithm>

#include "lib/error.h"
#include "lib/int_math.h"
#include "planner/folding.h"
#include "planner/pipeline_schedule.h"

namespace dhelix {
namespace {

// (first chunk, up chunk) layers of `stage` in `shape`'s layout, as the plan builder counts
// them: the W's down and up chunks, or 1F1B's one chunk and no up chunk.
std::pair<int64_t, int64_t> chunk_layers(const JobSpec& job, PipelineShape shape, int64_t stage) {
  const ParallelSpec& p = job.parallel;
  const auto s = static_cast<size_t>(stage);
  if (shape == PipelineShape::kOneFOneB) {
    return {unfold_layers(job.model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers)
                .stages[s]
                .count,
            0};
  }
  const FoldedLayout folded =
      fold_layers(job.model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers);
  return {folded.stages[s].down.count, folded.stages[s].up.count};
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
}

std::vector<StageMemory> scheme_memory(const JobSpec& job, PipelineScheme scheme,
                                       const MemoryOptions& options) {
  DHELIX_CHECK(scheme == PipelineScheme::kDHelix || scheme == PipelineScheme::kMegatron1F1B);
  const PipelineShape shape = scheme_shape(scheme);
  const ParallelSpec& p = job.parallel;
  std::vector<StageCosts> costs;
  for (int64_t stage = 0; stage < p.pp; ++stage) {
    StageCosts c;
    c.head_loss_transient_bytes = head_loss_transient_bytes(job.model, p);
    const auto [layers, up_layers] = chunk_layers(job, shape, stage);
    set_chunk_memory(job.model, p, layers, up_layers, options, c);
    costs.push_back(c);
  }
  const PipelineSchedule schedule = make_schedule(shape, p.pp, p.num_micro_batches());
  return stage_memory(job.model, p, shape, options, activation_peaks(schedule, costs));
}

}  // namespace dhelix
