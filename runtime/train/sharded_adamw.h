#pragma once
// AdamW with the distributed optimizer (Megatron-LM's --use-distributed-optimizer, the
// plan's options.distributed_optimizer, which the planner's memory model counts): each
// member of a bucket's group (gradient_reduction.h) keeps the AdamW moments of its shard of
// the bucket only, steps its shard from the reduce-scattered gradient, and the updated
// weights are all-gathered bucket by bucket so that every replica holds all of them again.
//
// The shards: bucket_shards.h (shared with the CUDA backend's device_gradient_reducer.h).
//
// Bits: AdamW is element by element (runtime/kernels/adamw.h) and the shard's gradient is
// the all-reduce's sum, so weights and moments equal those of AdamW on every element
// (optimizer.h) bit for bit. Checkpoints keep their format: state() all-gathers the moments
// (collective over each bucket's group: every rank calls it together, as the trainer does)
// and restore() keeps this rank's shard of the whole moments a checkpoint holds.
//
// Overlapped gather (the job's overlap_param_gather): step() leaves the all-gathers to the
// reduction thread (GradientReducer::start_gathers), and the next iteration's ops wait only
// for the buckets of their own layer.
//
// Threads: the all-gathers use the reduction's communicators; call step() and
// gather_moments() only while the GradientReducer is idle (after finish(); after
// wait_for_gathers() for gather_moments()).

#include <cstdint>
#include <vector>

#include "runtime/train/gradient_reduction.h"
#include "runtime/train/optimizer.h"

namespace dhelix::rt {

class ShardedAdamW {
 public:
  /// Moments for this rank's shard of every bucket of `reducer` (which must be sharded).
  ShardedAdamW(std::vector<ParameterView> params, GradientReducer& reducer);

  /// AdamW step t (1-based) on this rank's shards from the reducer's shard gradients, then
  /// the all-gather of the updated weights into every parameter's values: here, or with
  /// `overlap_gather` started on the reduction thread (see the file comment).
  void step(int64_t t, const AdamWSettings& settings, bool overlap_gather);

  /// Every parameter's whole first and second moments (in the parameter list's order),
  /// all-gathered from the shards. Collective over every bucket's group.
  void gather_moments(std::vector<std::vector<float>>& first,
                      std::vector<std::vector<float>>& second);
  /// Takes this rank's shard of parameter `index`'s whole moments (count elements each).
  void restore_moments(size_t index, const float* first, const float* second);

  /// Elements of moments this rank holds (per moment): of every bucket, or of the experts'
  /// buckets only (`experts_only`).
  int64_t shard_elements_held(bool experts_only = false) const;

 private:
  // for_each_shard_piece (bucket_shards.h) over this rank's shard of bucket `b`.
  template <class Visit>
  void for_each_piece(size_t b, Visit&& visit) const;
  void all_gather_bucket(size_t b, const std::vector<float>& shard, std::vector<float>& out);
  // Bucket b's updated weights, all-gathered into every parameter of it.
  void gather_weights(size_t b, std::vector<float>& staging);

  std::vector<ParameterView> params_;
  std::vector<int64_t> counts_;  // per parameter, elements
  GradientReducer& reducer_;
  std::vector<std::vector<float>> first_;    // per bucket, this rank's shard
  std::vector<std::vector<float>> second_;   // per bucket, this rank's shard
  std::vector<std::vector<float>> updated_;  // per bucket, this rank's shard of the weights
  std::vector<float> staging_;               // the calling thread's
  std::vector<float> gather_staging_;        // the reduction thread's
};

}  // namespace dhelix::rt
