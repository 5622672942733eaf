#pragma once
// How fully sharded data parallelism (the plan's options.fsdp, sharding strategy
// optim_grads_params: Megatron-Core's --use-megatron-fsdp, PyTorch FSDP2, ZeRO-3) splits one
// layer's parameters over the n members of its data-parallel group.
//
// The layer's tensors (ln_attn, w_qkv, w_proj, ln_mlp, w_fc1, w_fc2, this rank's TP shards
// of them) are laid end to end in that order, padded with zeros to a multiple of n, and cut
// into n equal shards: member r owns elements [r·s, (r+1)·s), s = ceil(elements / n). Each
// rank keeps only its shard of the weights, of the gradient and of the AdamW moments; the
// whole weights exist only between a gather and its release (runtime/model/fsdp_layers.h).
//
// Example (the numbers of a unit test): tensors of 3, 5 and 2 elements over 4 members:
//
//   element   0 1 2 | 3 4 5 6 7 | 8 9 | 10 11   (padding 10, 11)
//   member    0 0 0   1 1 1 2 2   2 3    3  3   s = 3
//
// Member 1 owns elements [3, 6), the second tensor's first three; member 2 the second's
// last two and the third's first; member 3 the third's last and the padding.
//
// The all-gather of the n shards (group-rank order: runtime/comm/communicator.h) is the
// padded whole; the reduce-scatter of a padded whole gradient leaves member r the sum of
// its shard. So the layout is the communicators' own, and a checkpoint keeps the whole
// tensors by name, the same files as without FSDP (runtime/train/cpu_engine.cc).
//
// Sequence parallelism. The norm gains' gradients are partial sums over the TP group's
// sequence shards (stage_model.h, sum_gradient_over_tp); the other tensors' are not. The TP
// peers of a rank hold the same tensor counts and the same DP coordinate, so their shards
// cover the same elements of the same tensors: the TP sum can run on the shard, over the
// ranges of the summed tensors that fall in it (tp_summed_ranges). In the example, with b
// summed, member 1's range is [0, 3) of its shard, member 2's [0, 2), the others' none.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/error.h"

namespace dhelix::rt {

/// Elements [begin, begin + count) of a shard.
struct ShardRange {
  int64_t begin = 0;
  int64_t count = 0;
  bool operator==(const ShardRange&) const = default;
};

class FsdpLayout {
 public:
  /// Tensors `names` of `counts` elements (>= 0) over `members` (>= 1); `summed_over_tp`
  /// (empty: none) marks the tensors whose gradients are summed over TP.
  FsdpLayout(std::vector<std::string> names, std::vector<int64_t> counts, int64_t members,
             std::vector<bool> summed_over_tp = {})
      : names_(std::move(names)),
        counts_(std::move(counts)),
        summed_over_tp_(std::move(summed_over_tp)),
        members_(members) {
    DHELIX_CHECK(members_ >= 1 && names_.size() == counts_.size());
    if (summed_over_tp_.empty()) summed_over_tp_.assign(names_.size(), false);
    DHELIX_CHECK(summed_over_tp_.size() == names_.size());
    for (const int64_t count : counts_) {
      DHELIX_CHECK(count >= 0);
      offsets_.push_back(elements_);
      elements_ += count;
    }
    shard_ = (elements_ + members_ - 1) / members_;
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  /// Where tensor i starts in the flattened layer.
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t elements() const { return elements_; }  ///< the tensors' total, unpadded
  int64_t members() const { return members_; }
  int64_t shard() const { return shard_; }              ///< s, elements per member
  int64_t padded() const { return shard_ * members_; }  ///< n·s, the gathered whole
  int64_t shard_begin(int64_t member) const { return member * shard_; }

  /// Member `member`'s shard of `whole` (the flattened tensors, elements() or padded()
  /// of them): s elements, zeros past the tensors' end.
  std::vector<float> shard_of(const std::vector<float>& whole, int64_t member) const {
    DHELIX_CHECK(member >= 0 && member < members_);
    DHELIX_CHECK(static_cast<int64_t>(whole.size()) >= elements_);
    std::vector<float> out(static_cast<size_t>(shard_), 0.0f);
    const int64_t begin = shard_begin(member);
    const int64_t end = std::min(begin + shard_, elements_);
    for (int64_t i = begin; i < end; ++i) out[static_cast<size_t>(i - begin)] = whole[i];
    return out;
  }

  /// The parts of member `member`'s shard that belong to tensors summed over TP, in shard
  /// coordinates, ascending, adjacent tensors' parts merged (see the file comment).
  std::vector<ShardRange> tp_summed_ranges(int64_t member) const {
    DHELIX_CHECK(member >= 0 && member < members_);
    std::vector<ShardRange> ranges;
    const int64_t begin = shard_begin(member), end = begin + shard_;
    for (size_t t = 0; t < counts_.size(); ++t) {
      if (!summed_over_tp_[t]) continue;
      const int64_t first = std::max(begin, offsets_[t]);
      const int64_t last = std::min(end, offsets_[t] + counts_[t]);
      if (first >= last) continue;
      if (!ranges.empty() && ranges.back().begin + ranges.back().count == first - begin) {
        ranges.back().count += last - first;
      } else {
        ranges.push_back({first - begin, last - first});
      }
    }
    return ranges;
  }

  /// Tensor `index`'s elements of a flattened (gathered) layer.
  std::vector<float> tensor_of(const std::vector<float>& whole, size_t index) const {
    DHELIX_CHECK(index < counts_.size() && static_cast<int64_t>(whole.size()) >= elements_);
    const auto first = whole.begin() + offsets_[index];
    return {first, first + counts_[index]};
  }

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> counts_;
  std::vector<bool> summed_over_tp_;
  std::vector<int64_t> offsets_;
  int64_t members_ = 1;
  int64_t elements_ = 0;
  int64_t shard_ = 0;
};

}  // namespace dhelix::rt
