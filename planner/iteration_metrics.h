#pragma once
// Throughput figures of one simulated iteration: tokens per second, model TFLOPS per GPU and
// model FLOPs utilisation (MFU), with Megatron-LM's FLOP count (lib/model_spec.h), so that
// they compare with published figures.

#include <cstdint>

#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

struct IterationMetrics {
  double iteration_us = 0;
  int64_t tokens = 0;      ///< global_batch_size · seq_length
  double model_flops = 0;  ///< training_flops_per_iteration for the global batch
  double tokens_per_second = 0;
  double tflops_per_gpu = 0;  ///< model_flops / iteration time / world size, in 1e12
  double mfu = 0;             ///< tflops_per_gpu / peak_tflops (0 when the peak is unknown)
};

/// Metrics of an iteration of `iteration_us` > 0 microseconds on GPUs of `peak_tflops`.
/// Error(kInvalidInput) when iteration_us <= 0.
IterationMetrics iteration_metrics(const ModelSpec& model, const ParallelSpec& parallel,
                                   double peak_tflops, double iteration_us);

}  // namespace dhelix
