#pragma once
// Data-parallel gradient sums in buckets, as Megatron-LM's --ddp-bucket-size: instead of
// one NCCL all-reduce per parameter (a few hundred small collectives per step, each paying
// NCCL's launch and latency cost), the gradients are laid out back to back in buckets of
// about `bucket_elements` and each bucket is summed by one all-reduce. A parameter is never
// split; one larger than the bucket size gets a bucket of its own.
//
// Example: parameters of 3, 5, 2 and 9 elements with bucket_elements = 8 give the buckets
// {3, 5} (8 elements), {2} (adding the 9 would pass 8) and {9} (alone, over the size).
//
// Both backends use this layout. The CPU engine orders the parameters by when their
// gradients become final in the rank program and sums each bucket as soon as it is
// (runtime/train/gradient_reduction.h); the CUDA engine in the same buckets, each packed
// into a contiguous staging buffer on a reduction stream, all-reduced, and copied back
// (runtime/cuda/device_gradient_reducer.h). Sums of the same bucket layout are reproducible run to
// run under NCCL's pinned algorithm and protocol (nccl_communicator.h); changing the bucket size
// changes NCCL's reduction chunking and hence the last bits, so --verify compares runs of one size.

#include <cstdint>
#include <vector>

namespace dhelix::rt {

/// Megatron-LM's default bucket size, elements.
inline constexpr int64_t kDefaultDdpBucketElements = 40'000'000;

/// One bucket: parameters [first, first + count) of the list, total elements, and where
/// each parameter starts in the bucket's contiguous buffer.
struct GradientBucket {
  int64_t first = 0;
  int64_t count = 0;
  int64_t elements = 0;
  std::vector<int64_t> offsets;  ///< per parameter of the bucket, elements from its start
};

/// Buckets over parameters of `sizes` elements, in list order (see the file comment).
/// Throws Error(kInvalidInput) for bucket_elements < 1 or a negative size.
std::vector<GradientBucket> plan_gradient_buckets(const std::vector<int64_t>& sizes,
                                                  int64_t bucket_elements);

}  // namespace dhelix::rt
