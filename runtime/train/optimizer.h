#pragma once
// The optimizer step of one rank: gradient synchronisation, then AdamW.
//
// Gradients leave the iteration as local partial sums. Two reductions make them whole:
// over TP for the weights every TP rank holds whole but only partly differentiates (the
// norm gains under sequence parallelism, as Megatron's allreduce of "sequence parallel"
// gradients), and over DP, the data-parallel gradient all-reduce. Both are sums: the loss
// scale (1 / tokens of the global batch) already makes them the gradient of the global
// mean. Both go through the deterministic collectives of runtime/comm, so every replica
// ends the step with bit-identical weights.

#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// Hyper-parameters of AdamW (runtime/kernels/adamw.h), constant over the run.
struct AdamWSettings {
  float lr = 3e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

/// The reference reduction, one parameter at a time after the iteration (the CPU engine sums
/// in buckets: runtime/train/gradient_reduction.h, tested bitwise against this).
/// Sums gradients over `tp` where the model asks for it and over `dp` (when it has more
/// than one member): the DP x CP group of the ranks holding the same weights. MoE experts'
/// gradients (ParameterView::expert) go over `expert_dp` instead, the expert-data-parallel
/// group (runtime/comm/process_groups.h; required when any is).
void synchronise_gradients(const std::vector<ParameterView>& params, Communicator& tp,
                           Communicator& dp, Communicator* expert_dp = nullptr);

/// AdamW moments of every parameter of a rank, in StageModel::parameters() order.
class AdamW {
 public:
  explicit AdamW(const std::vector<ParameterView>& params);

  /// Applies step t (1-based) to every parameter from its gradient.
  void step(const std::vector<ParameterView>& params, int64_t t, const AdamWSettings& settings);

  std::vector<float>& first_moment(size_t index) { return first_[index]; }
  std::vector<float>& second_moment(size_t index) { return second_[index]; }

 private:
  std::vector<std::vector<float>> first_;
  std::vector<std::vector<float>> second_;
};

}  // namespace dhelix::rt
