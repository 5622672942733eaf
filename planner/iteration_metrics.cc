#include "planner/iteration_metrics.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {

IterationMetrics iteration_metrics(const ModelSpec& model, const ParallelSpec& parallel,
                                   double peak_tflops, double iteration_us,
                                   const std::string& times_source) {
  if (!(iteration_us > 0)) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("iteration metrics: iteration time {} us must be > 0", iteration_us));
  }
  IterationMetrics m;
  m.iteration_us = iteration_us;
  m.tokens = parallel.global_batch_size * parallel.seq_length;
  m.model_flops =
      training_flops_per_iteration(model, parallel.global_batch_size, parallel.seq_length);
  const double seconds = iteration_us * 1e-6;
  m.tokens_per_second = static_cast<double>(m.tokens) / seconds;
  m.tflops_per_gpu = m.model_flops / seconds / static_cast<double>(parallel.world_size()) / 1e12;
  m.mfu = peak_tflops > 0 ? m.tflops_per_gpu / peak_tflops : 0.0;
  if (m.mfu > 1.0) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("{}: its times give an iteration of {:.6g} us, which would compute the "
                    "job's {:.4g} FLOPs (Megatron's count) at {:.1f} % of the peak of its {} "
                    "GPUs ({:.6g} TFLOP/s each): faster than they can; the op times are too "
                    "short for this hardware (docs/cost-model.md, \"Physical bounds\")",
                    times_source, iteration_us, m.model_flops, m.mfu * 100, parallel.world_size(),
                    peak_tflops));
  }
  return m;
}

}  // namespace dhelix
