#include "planner/scheme_memory.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/int_math.h"
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
  const PipelineShape shape = scheme_shape(scheme);
  const ParallelSpec& p = job.parallel;
  std::vector<StageCosts> costs;
  for (const auto& [layers, up_layers] : stage_chunk_layers(job, shape)) {
    StageCosts c;
    c.head_loss_transient_bytes = head_loss_transient_bytes(job.model, p);
    set_chunk_memory(job.model, p, layers, up_layers, options, c);
    costs.push_back(c);
  }
  const PipelineSchedule schedule = make_schedule(shape, p.pp, p.num_micro_batches());
  return stage_memory(job.model, p, shape, options, activation_peaks(schedule, costs));
}

}  // namespace dhelix
