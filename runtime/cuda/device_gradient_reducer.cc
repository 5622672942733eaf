#include "runtime/cuda/device_gradient_reducer.h"

#include <algorithm>

#include "lib/error.h"
#include "runtime/train/bucket_shards.h"

namespace dhelix::cuda {

DeviceGradientReducer::DeviceGradientReducer(DeviceApi& api, std::vector<DeviceParameter> params,
                                             std::vector<rt::ReductionBucket> buckets,
                                             DeviceReductionGroups groups, StreamHandle compute,
                                             StreamHandle reduction, bool sharded,
                                             const DeviceFloats& allocate,
                                             DeviceOptimizerKernels kernels)
    : api_(api),
      params_(std::move(params)),
      buckets_(std::move(buckets)),
      groups_(groups),
      compute_(compute),
      reduction_(reduction),
      sharded_(sharded),
      kernels_(std::move(kernels)) {
  DHELIX_CHECK_MSG(!sharded_ || (reduction_ != nullptr && kernels_.adamw && kernels_.refresh),
                   "the distributed optimizer needs a reduction stream and its kernels");
  DHELIX_CHECK_MSG(!sharded_ || groups_.dense != nullptr,
                   "the distributed optimizer without a data-parallel group");
  for (const DeviceParameter& p : params_) {
    names_.push_back(p.name);
    counts_.push_back(p.count);
  }
  int64_t staging = 0, padding = 1;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (reduction_ == nullptr || group_of(b) == nullptr) continue;
    const int64_t members = group_of(b)->size(), shard = shard_of(b);
    if (sharded_) {
      staging = std::max(staging, shard * members);
      padding = std::max(padding, shard * members - buckets_[b].elements);
      for (auto* list : {&shard_gradients_, &first_, &second_, &updated_}) {
        list->push_back(allocate(shard));
      }
    } else if (buckets_[b].parameters.size() > 1) {
      staging = std::max(staging, buckets_[b].elements);
    }
  }
  if (staging > 0) staging_ = allocate(staging);
  if (sharded_) zeros_ = allocate(padding);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    ready_.push_back(api_.create_event(false));
    if (sharded_) gathered_.push_back(api_.create_event(false));
  }
  reduced_ = api_.create_event(false);
  all_gathered_ = api_.create_event(false);
  next_ = buckets_.size();  // nothing pending before the first start()
}

DeviceGradientReducer::~DeviceGradientReducer() {
  for (EventHandle event : ready_) api_.destroy_event(event);
  for (EventHandle event : gathered_) api_.destroy_event(event);
  api_.destroy_event(reduced_);
  api_.destroy_event(all_gathered_);
}

DeviceCommunicator* DeviceGradientReducer::group_of(size_t bucket) const {
  return buckets_[bucket].expert ? groups_.expert : groups_.dense;
}

int64_t DeviceGradientReducer::shard_of(size_t bucket) const {
  return rt::shard_elements(buckets_[bucket].elements, group_of(bucket)->size());
}

void DeviceGradientReducer::copy(void* to, const void* from, int64_t floats, StreamHandle stream) {
  api_.copy_device(to, from, floats * static_cast<int64_t>(sizeof(float)), stream);
}

const DeviceGradientReducer::ProgramView& DeviceGradientReducer::view_of(
    const RankProgram& program) {
  for (const auto& [known, view] : views_) {
    if (known == &program && view.reads.size() == program.instructions.size()) return view;
  }
  views_.emplace_back(&program,
                      ProgramView{.last_writer = rt::bucket_last_writers(buckets_, names_, program),
                                  .reads = rt::buckets_read_by(buckets_, names_, program)});
  return views_.back().second;
}

DeviceGradientReducer::Hooks DeviceGradientReducer::start(const RankProgram& program,
                                                          bool overlap) {
  // view_of may grow views_: take the pointer after it.
  const ProgramView& view = view_of(program);
  current_ = &view;
  next_ = 0;
  reduced_recorded_ = false;
  waited_.clear();
  Hooks hooks;
  if (overlap) {
    hooks.after_instruction = [this](size_t index, StreamHandle stream) {
      issue_ready(index, stream);
    };
  }
  if (gathers_pending_) {
    hooks.before_instruction = [this](size_t index, StreamHandle stream) {
      wait_for_gathers(index, stream);
    };
  }
  return hooks;
}

void DeviceGradientReducer::issue_ready(size_t index, StreamHandle stream) {
  while (next_ < buckets_.size() && current_->last_writer[next_] <= static_cast<int64_t>(index)) {
    issue(next_++, stream);
  }
}

void DeviceGradientReducer::wait_for_gathers(size_t index, StreamHandle stream) {
  for (int32_t b : current_->reads[index]) {
    if (waited_.emplace(stream, b).second)
      api_.wait_event(stream, gathered_[static_cast<size_t>(b)]);
  }
}

void DeviceGradientReducer::issue(size_t bucket, StreamHandle stream) {
  const rt::ReductionBucket& b = buckets_[bucket];
  for (int64_t index : b.parameters) {
    const DeviceParameter& p = params_[static_cast<size_t>(index)];
    if (!p.sum_gradient_over_tp || groups_.tp == nullptr || groups_.tp->size() == 1) continue;
    // The TP communicator of the compute stream: no other stream may use it.
    DHELIX_CHECK_MSG(stream == compute_, "a gradient finished off the compute stream");
    groups_.tp->all_reduce_sum(p.gradient, p.count, DeviceDtype::kFloat32, stream);
  }
  // Without a group there is nothing to sum (dp x cp = 1 with experts apart).
  if (reduction_ == nullptr || group_of(bucket) == nullptr) return;
  api_.record_event(ready_[bucket], stream);
  api_.wait_event(reduction_, ready_[bucket]);
  reduce_on_stream(bucket);
  api_.record_event(reduced_, reduction_);
  reduced_recorded_ = true;
}

void DeviceGradientReducer::reduce_on_stream(size_t bucket) {
  const rt::ReductionBucket& b = buckets_[bucket];
  DeviceCommunicator& group = *group_of(bucket);
  auto pack = [&] {
    for (size_t j = 0; j < b.parameters.size(); ++j) {
      const DeviceParameter& p = params_[static_cast<size_t>(b.parameters[j])];
      copy(staging_ + b.offsets[j], p.gradient, p.count, reduction_);
    }
  };
  if (sharded_) {
    // Packed, zero-padded to members x shard, reduce-scattered: the local gradients stay.
    const int64_t shard = shard_of(bucket), padded = shard * group.size();
    pack();
    if (padded > b.elements) copy(staging_ + b.elements, zeros_, padded - b.elements, reduction_);
    group.reduce_scatter_sum(staging_, shard, DeviceDtype::kFloat32, shard_gradients_[bucket],
                             reduction_);
    return;
  }
  if (group.size() == 1) return;
  if (b.parameters.size() == 1) {
    const DeviceParameter& p = params_[static_cast<size_t>(b.parameters.front())];
    group.all_reduce_sum(p.gradient, p.count, DeviceDtype::kFloat32, reduction_);
    return;
  }
  pack();
  group.all_reduce_sum(staging_, b.elements, DeviceDtype::kFloat32, reduction_);
  for (size_t j = 0; j < b.parameters.size(); ++j) {
    const DeviceParameter& p = params_[static_cast<size_t>(b.parameters[j])];
    copy(p.gradient, staging_ + b.offsets[j], p.count, reduction_);
  }
}

void DeviceGradientReducer::finish() {
  while (next_ < buckets_.size()) issue(next_++, compute_);
  // reduced_ was recorded by this iteration's last reduction (here or during the backward).
  if (reduced_recorded_) api_.wait_event(compute_, reduced_);
}

template <class Visit>
void DeviceGradientReducer::for_each_piece(size_t bucket, Visit&& visit) const {
  rt::for_each_shard_piece(buckets_[bucket], counts_, group_of(bucket)->rank(), shard_of(bucket),
                           visit);
}

void DeviceGradientReducer::step(const kernels::AdamWStep& step, bool overlap_gather) {
  DHELIX_CHECK(sharded_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for_each_piece(b, [&](int64_t p, int64_t at, int64_t in_shard, int64_t count) {
      const auto index = static_cast<size_t>(p);
      kernels_.adamw(step, index, at, count, shard_gradients_[b] + in_shard, first_[b] + in_shard,
                     second_[b] + in_shard, reduction_);
      copy(updated_[b] + in_shard, params_[index].values + at, count, reduction_);
    });
  }
  api_.record_event(reduced_, reduction_);
  api_.wait_event(compute_, reduced_);
  // Every member's updated shard back into every parameter, last bucket first.
  for (size_t b = buckets_.size(); b-- > 0;) {
    DeviceCommunicator& group = *group_of(b);
    group.all_gather(updated_[b], shard_of(b), DeviceDtype::kFloat32, staging_, reduction_);
    const rt::ReductionBucket& bucket = buckets_[b];
    for (size_t j = 0; j < bucket.parameters.size(); ++j) {
      const auto index = static_cast<size_t>(bucket.parameters[j]);
      copy(params_[index].values, staging_ + bucket.offsets[j], params_[index].count, reduction_);
      kernels_.refresh(index, reduction_);
    }
    api_.record_event(gathered_[b], reduction_);
  }
  gathers_pending_ = overlap_gather;
  if (!overlap_gather) {
    api_.record_event(all_gathered_, reduction_);
    api_.wait_event(compute_, all_gathered_);
  }
}

void DeviceGradientReducer::synchronize() {
  DeviceCommunicator* any = groups_.dense != nullptr ? groups_.dense : groups_.expert;
  if (reduction_ != nullptr && any != nullptr) any->wait(reduction_);
}

int64_t DeviceGradientReducer::shard_elements_held(bool experts_only) const {
  int64_t held = 0;
  if (!sharded_) return 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!experts_only || buckets_[b].expert) held += shard_of(b);
  }
  return held;
}

void DeviceGradientReducer::gather_moments(bool second,
                                           const std::function<void(size_t, const float*)>& take) {
  DHELIX_CHECK(sharded_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    group_of(b)->all_gather(second ? second_[b] : first_[b], shard_of(b), DeviceDtype::kFloat32,
                            staging_, reduction_);
    synchronize();
    const rt::ReductionBucket& bucket = buckets_[b];
    for (size_t j = 0; j < bucket.parameters.size(); ++j) {
      take(static_cast<size_t>(bucket.parameters[j]), staging_ + bucket.offsets[j]);
    }
  }
}

std::vector<DeviceGradientReducer::MomentPiece> DeviceGradientReducer::moment_pieces(
    size_t p) const {
  std::vector<MomentPiece> pieces;
  for (size_t b = 0; b < buckets_.size() && sharded_; ++b) {
    for_each_piece(b, [&](int64_t parameter, int64_t at, int64_t in_shard, int64_t count) {
      if (static_cast<size_t>(parameter) != p) return;
      pieces.push_back({at, count, first_[b] + in_shard, second_[b] + in_shard});
    });
  }
  return pieces;
}

}  // namespace dhelix::cuda
