#pragma once
// The distributed optimizer's shards of a gradient bucket (gradient_reduction.h), for both
// engines (the CPU's sharded_adamw.h, the CUDA backend's device_gradient_reducer.h): the
// bucket's elements padded to members x shard, member r owning elements [r·s, (r+1)·s).
//
// Example: a bucket of parameters of 3 and 4 elements over 2 members: 7 elements padded to
// 8, member 0 owns [0, 4) (the first parameter and the second's first element), member 1
// [4, 7) (the rest of the second; its padding element belongs to no parameter).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/train/gradient_reduction.h"

namespace dhelix::rt {

/// Calls visit(parameter, offset in the parameter, offset in the shard, count) for every
/// piece of `bucket`'s parameters (`counts`: every parameter's elements, by index) inside
/// member `member`'s shard of `shard` elements.
template <class Visit>
void for_each_shard_piece(const ReductionBucket& bucket, const std::vector<int64_t>& counts,
                          int64_t member, int64_t shard, Visit&& visit) {
  const int64_t begin = member * shard;
  const int64_t end = std::min(begin + shard, bucket.elements);
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    const int64_t parameter = bucket.parameters[j];
    const int64_t from = std::max(begin, bucket.offsets[j]);
    const int64_t to = std::min(end, bucket.offsets[j] + counts[static_cast<size_t>(parameter)]);
    if (from < to) visit(parameter, from - bucket.offsets[j], from - begin, to - from);
  }
}

}  // namespace dhelix::rt
