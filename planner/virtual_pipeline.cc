#include "planner/virtual_pipeline.h"

#include <fmt/format.h>

#include <string>

#include "lib/error.h"
#include "lib/stage_split.h"
#include "planner/baseline_schedules.h"

namespace dhelix {

int64_t virtual_pipeline_size(const JobSpec& job, int64_t micro_batches, int64_t requested) {
  const ParallelSpec& par = job.parallel;
  const int64_t layers = job.model.num_layers;
  std::string why;
  if (requested == 0) {
    if (par.pp < 2 || micro_batches < par.pp || micro_batches % par.pp != 0) return 1;
    for (int64_t v = kDefaultMaxVirtualPipelineSize; v > 1; --v) {
      if (interleaved_stage_layers(layers, par, v, why)) return v;
    }
    return 1;
  }
  if (requested < 1) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("--virtual-pipeline-model-parallel-size {}: it must be >= 1", requested));
  }
  if (requested == 1) return 1;
  if (micro_batches % par.pp != 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--virtual-pipeline-model-parallel-size {}: the micro-batches ({}) "
                            "must be a multiple of pp ({}), as Megatron requires",
                            requested, micro_batches, par.pp));
  }
  if (!interleaved_stage_layers(layers, par, requested, why)) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--virtual-pipeline-model-parallel-size {}: Megatron refuses it for "
                            "num_layers = {} on pp = {}: {}",
                            requested, layers, par.pp, why));
  }
  return requested;
}

}  // namespace dhelix
