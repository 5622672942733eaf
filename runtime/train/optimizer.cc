#include "runtime/train/optimizer.h"

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"

namespace dhelix::rt {

void synchronise_gradients(const std::vector<ParameterView>& params, Communicator& tp,
                           Communicator& dp, Communicator* expert_dp) {
  for (const ParameterView& param : params) {
    if (param.sum_gradient_over_tp && tp.size() > 1) tp.all_reduce_sum(param.gradient, param.count);
    DHELIX_CHECK(!param.expert || expert_dp != nullptr);
    Communicator& replicas = param.expert ? *expert_dp : dp;
    if (replicas.size() > 1) replicas.all_reduce_sum(param.gradient, param.count);
  }
}

AdamW::AdamW(const std::vector<ParameterView>& params) {
  for (const ParameterView& param : params) {
    first_.emplace_back(static_cast<size_t>(param.count), 0.0f);
    second_.emplace_back(static_cast<size_t>(param.count), 0.0f);
  }
}

void AdamW::step(const std::vector<ParameterView>& params, int64_t t,
                 const AdamWSettings& settings) {
  DHELIX_CHECK(params.size() == first_.size());
  const kernels::AdamWStep step = kernels::make_adamw_step(
      t, settings.lr, settings.beta1, settings.beta2, settings.eps, settings.weight_decay);
  for (size_t i = 0; i < params.size(); ++i) {
    cpu::adamw_update(step, params[i].count, params[i].gradient, params[i].values, first_[i].data(),
                      second_[i].data());
  }
}

}  // namespace dhelix::rt
