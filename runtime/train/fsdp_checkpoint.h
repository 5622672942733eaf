#pragma once
// Checkpoints of FSDP shards (runtime/model/fsdp_layers.h), shared by the CPU and CUDA
// engines: a checkpoint keeps a layer's whole tensors by name, the same files as without
// FSDP, so a shard is all-gathered over the host's DP communicator to be saved and cut
// back out of the whole tensors to be restored (the layout: runtime/model/fsdp_layout.h).
//
//   saved tensor               from
//   <tensor>                   the gathered weights, the tensor's elements
//   adam_m/<tensor>            the gathered first moments
//   adam_v/<tensor>            the gathered second moments
//
// The gathers are collective over DP: every member calls them for the same layers in the
// same order (the engines walk their parameters in the model's order), between iterations.

#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/fsdp_layout.h"
#include "runtime/train/checkpoint.h"

namespace dhelix::rt {

/// Appends the whole tensors of a layer whose shard (values, first, second: layout.shard()
/// host floats each) this rank holds, gathered over `dp` (its rank is the shard's member).
inline void add_gathered_fsdp_shard(std::vector<NamedTensor>& tensors, const FsdpLayout& layout,
                                    Communicator& dp, const float* values, const float* first,
                                    const float* second) {
  const auto gather = [&](const float* part) {
    std::vector<float> whole(static_cast<size_t>(layout.padded()));
    dp.all_gather(part, layout.shard(), whole.data());
    return whole;
  };
  const std::vector<float> whole_values = gather(values);
  const std::vector<float> whole_first = gather(first);
  const std::vector<float> whole_second = gather(second);
  for (size_t t = 0; t < layout.names().size(); ++t) {
    const std::string& name = layout.names()[t];
    tensors.push_back({name, layout.tensor_of(whole_values, t)});
    tensors.push_back({"adam_m/" + name, layout.tensor_of(whole_first, t)});
    tensors.push_back({"adam_v/" + name, layout.tensor_of(whole_second, t)});
  }
}

/// Member `member`'s shard (layout.shard() floats) of the whole tensors `prefix`<name> that
/// `shard` holds ("" for the weights, "adam_m/", "adam_v/").
inline std::vector<float> fsdp_shard_from_checkpoint(const RankShard& shard,
                                                     const FsdpLayout& layout,
                                                     const std::string& prefix, int64_t member) {
  std::vector<float> whole(static_cast<size_t>(layout.elements()));
  for (size_t t = 0; t < layout.names().size(); ++t) {
    shard.copy_into(prefix + layout.names()[t], whole.data() + layout.offsets()[t],
                    layout.counts()[t]);
  }
  return layout.shard_of(whole, member);
}

}  // namespace dhelix::rt
