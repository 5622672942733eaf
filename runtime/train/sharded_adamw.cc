#include "runtime/train/sharded_adamw.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/train/bucket_shards.h"

namespace dhelix::rt {

ShardedAdamW::ShardedAdamW(std::vector<ParameterView> params, GradientReducer& reducer)
    : params_(std::move(params)), reducer_(reducer) {
  for (const ParameterView& p : params_) counts_.push_back(p.count);
  for (size_t b = 0; b < reducer_.buckets().size(); ++b) {
    const size_t shard = reducer_.shard_gradient(b).size();
    first_.emplace_back(shard, 0.0f);
    second_.emplace_back(shard, 0.0f);
    updated_.emplace_back(shard, 0.0f);
  }
  reducer_.set_gather([this](size_t b) { gather_weights(b, gather_staging_); });
}

template <class Visit>
void ShardedAdamW::for_each_piece(size_t b, Visit&& visit) const {
  for_each_shard_piece(reducer_.buckets()[b], counts_, reducer_.group_of(b).rank(),
                       static_cast<int64_t>(first_[b].size()), visit);
}

void ShardedAdamW::all_gather_bucket(size_t b, const std::vector<float>& shard,
                                     std::vector<float>& out) {
  Communicator& group = reducer_.group_of(b);
  out.resize(shard.size() * static_cast<size_t>(group.size()));
  group.all_gather(shard.data(), static_cast<int64_t>(shard.size()), out.data());
}

void ShardedAdamW::gather_weights(size_t b, std::vector<float>& staging) {
  // Every member's updated shard, back into every parameter of the bucket.
  all_gather_bucket(b, updated_[b], staging);
  const ReductionBucket& bucket = reducer_.buckets()[b];
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    const ParameterView& param = params_[static_cast<size_t>(bucket.parameters[j])];
    std::memcpy(param.values, staging.data() + bucket.offsets[j],
                static_cast<size_t>(param.count) * sizeof(float));
  }
}

void ShardedAdamW::step(int64_t t, const AdamWSettings& settings, bool overlap_gather) {
  const kernels::AdamWStep step = kernels::make_adamw_step(
      t, settings.lr, settings.beta1, settings.beta2, settings.eps, settings.weight_decay);
  for (size_t b = 0; b < first_.size(); ++b) {
    const std::vector<float>& gradient = reducer_.shard_gradient(b);
    std::vector<float>& shard_values = updated_[b];
    for_each_piece(b, [&](int64_t p, int64_t at, int64_t in_shard, int64_t count) {
      float* values = params_[static_cast<size_t>(p)].values + at;
      cpu::adamw_update(step, count, gradient.data() + in_shard, values,
                        first_[b].data() + in_shard, second_[b].data() + in_shard);
      std::memcpy(shard_values.data() + in_shard, values,
                  static_cast<size_t>(count) * sizeof(float));
    });
  }
  if (overlap_gather) {
    reducer_.start_gathers();
    return;
  }
  for (size_t b = 0; b < first_.size(); ++b) gather_weights(b, staging_);
}

void ShardedAdamW::gather_moments(std::vector<std::vector<float>>& first,
                                  std::vector<std::vector<float>>& second) {
  first.assign(params_.size(), {});
  second.assign(params_.size(), {});
  for (size_t b = 0; b < first_.size(); ++b) {
    const ReductionBucket& bucket = reducer_.buckets()[b];
    for (auto [shard, whole] : {std::pair{&first_[b], &first}, std::pair{&second_[b], &second}}) {
      all_gather_bucket(b, *shard, staging_);
      for (size_t j = 0; j < bucket.parameters.size(); ++j) {
        const auto p = static_cast<size_t>(bucket.parameters[j]);
        const float* from = staging_.data() + bucket.offsets[j];
        (*whole)[p].assign(from, from + params_[p].count);
      }
    }
  }
}

void ShardedAdamW::restore_moments(size_t index, const float* first, const float* second) {
  for (size_t b = 0; b < first_.size(); ++b) {
    for_each_piece(b, [&](int64_t p, int64_t at, int64_t in_shard, int64_t count) {
      if (static_cast<size_t>(p) != index) return;
      std::copy(first + at, first + at + count, first_[b].begin() + in_shard);
      std::copy(second + at, second + at + count, second_[b].begin() + in_shard);
    });
  }
}

int64_t ShardedAdamW::shard_elements_held(bool experts_only) const {
  int64_t held = 0;
  for (size_t b = 0; b < first_.size(); ++b) {
    if (!experts_only || reducer_.buckets()[b].expert) {
      held += static_cast<int64_t>(first_[b].size());
    }
  }
  return held;
}

}  // namespace dhelix::rt
