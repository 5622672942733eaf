#pragma once
// Throughput figures of one simulated iteration: tokens per second, model TFLOPS per GPU and
// model FLOPs utilisation (MFU), with Megatron-LM's FLOP count (lib/model_spec.h), so that
// they compare with published figures.
//
// MFU never exceeds 100 %: iteration_metrics refuses an iteration faster than the GPUs' peak
// allows for the model's FLOPs. Every op time the planner accepts is at least the op's work
// at peak (lib/profile_bounds.h), but that alone does not bound MFU: Megatron's count
// includes the masked half of causal attention, which kernels skip, so a profile with every
// op at its bound gives 102-120 % on long sequences (tests/planner/mfu_bound_test.cc).

#include <cstdint>
#include <string>

#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

struct IterationMetrics {
  double iteration_us = 0;
  int64_t tokens = 0;      ///< global_batch_size · seq_length
  double model_flops = 0;  ///< training_flops_per_iteration for the global batch
  double tokens_per_second = 0;
  double tflops_per_gpu = 0;  ///< model_flops / iteration time / world size, in 1e12
  double mfu = 0;             ///< tflops_per_gpu / peak_tflops, <= 1 (0 when the peak is unknown)
};

/// Metrics of an iteration of `iteration_us` > 0 microseconds on GPUs of `peak_tflops`.
/// Error(kInvalidInput) when iteration_us <= 0, or when the MFU would exceed 1: the times
/// behind the iteration (named by `times_source`, e.g. the profile file) are faster than the
/// hardware can compute the model's FLOPs.
IterationMetrics iteration_metrics(const ModelSpec& model, const ParallelSpec& parallel,
                                   double peak_tflops, double iteration_us,
                                   const std::string& times_source = "iteration metrics");

}  // namespace dhelix
