#pragma once
// Data-parallel gradient reduction and parameter gathering, overlapped as Megatron-LM's
// distributed data parallel does it with --overlap-grad-reduce and --overlap-param-gather
// (both on in current Megatron examples; a job turns them off in "parallel").
//
// Megatron groups the gradients into buckets of max(40M, 1M · dp) parameters
// (DistributedDataParallelConfig.bucket_size's default). With --overlap-grad-reduce a bucket's
// reduce-scatter (all-reduce without the distributed optimizer) starts as soon as the last
// micro-batch's backward has produced all of its gradients; the buckets queue on the DP link,
// so the reduction hides under that backward except what does not fit and the last bucket,
// which only starts when the backward ends:
//
//   exposed_reduce = max(reduce / buckets, reduce − backward window)
//
// With --overlap-param-gather the all-gather of the updated bf16 parameters runs bucket by
// bucket under the next iteration's first forward; the first bucket is needed before the
// first layer can run:
//
//   exposed_gather = max(gather / buckets, gather − forward window)
//
// Worked example: reduce 12 ms, gather 6 ms in 4 buckets, backward window 10 ms, forward
// window 5 ms: exposed reduce max(3, 2) = 3 ms, exposed gather max(1.5, 1) = 1.5 ms; hidden
// 9 + 4.5 ms. The compute slowdown of the kernels the reduction runs beside is not charged
// (the interference model charges it inside layers only).

#include <cstdint>

namespace dhelix {

/// Megatron-Core's default DDP bucket size, parameters: max(40,000,000, 1,000,000 · dp).
int64_t megatron_dp_bucket_parameters(int64_t dp_group_size);

/// Buckets a stage's `parameters` fall into (at least 1).
int64_t megatron_dp_buckets(int64_t parameters, int64_t dp_group_size);

/// One stage's data-parallel time after overlap, microseconds.
struct DpOverlap {
  double exposed_us = 0;  ///< what lengthens the iteration: reduce_exposed_us + gather_exposed_us
  double hidden_us = 0;   ///< what runs under the backward / forward
  double reduce_exposed_us = 0;  ///< the gradient reduction's part after the last backward
  double gather_exposed_us = 0;  ///< the parameter gather's part before the first forward
};

/// What one stage pays for a gradient reduction of `reduce_us` and a parameter gather of
/// `gather_us` (0 without the distributed optimizer) in `buckets` buckets, with the last
/// micro-batch's backward (`backward_window_us`) and the first micro-batch's forward
/// (`forward_window_us`) to hide under; a switch that is off exposes its part whole.
DpOverlap overlap_dp(double reduce_us, double gather_us, int64_t buckets, double backward_window_us,
                     double forward_window_us, bool overlap_grad_reduce, bool overlap_param_gather);

}  // namespace dhelix
