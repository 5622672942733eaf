#pragma once
// BasicStageModel<B>'s fully sharded data parallelism (fsdp_layers.h says what, when and
// why): sharding the layers at construction, binding the plan's fsdp ops, releasing the
// gathered buffers after their last use, and the iteration-end sum of the reduced shards.
// Included only by stage_model_impl.h.

#include <fmt/format.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/model/gradient_writers.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_state.h"

namespace dhelix::rt {
namespace model_detail {

/// Throws Error(kUnsupported) naming every setting FSDP does not run with (fsdp_layers.h's
/// failure rules).
inline void check_fsdp_supported(const JobSpec& job) {
  std::vector<std::string> refused;
  if (job.model.is_moe()) {
    // dhelix-plan plans them (lib/dag_builder_fsdp.cc), but a plan names a collective's
    // group by dimension: the experts' gathers over the expert-data-parallel group would
    // run on the dp communicator.
    refused.push_back(
        "mixture-of-experts layers (the experts' gathers and reduce-scatters run over the "
        "expert-data-parallel group, which a plan's collectives cannot name yet)");
  }
  if (job.parallel.cp > 1)
    refused.push_back(fmt::format("context parallelism (cp = {})", job.parallel.cp));
  if (refused.empty()) return;
  std::string list;
  for (const std::string& what : refused) list += (list.empty() ? "" : "; ") + what;
  throw Error(ErrorCode::kUnsupported,
              fmt::format("StageModel: fully sharded data parallelism (the plan's options.fsdp) "
                          "is not run with {} yet; plan the job without fsdp",
                          list));
}

}  // namespace model_detail

// The layer's tensors flattened in LayerTensors order; this rank keeps its shard only.
template <class B>
void BasicStageModel<B>::Impl::shard_layer(int64_t layer, const model_detail::HostLayer& host,
                                           int64_t dp_rank, int64_t dp) {
  std::vector<std::string> names;
  std::vector<int64_t> counts;
  std::vector<bool> summed_over_tp;  // the norm gains under SP: summed on the shard
  std::vector<float> whole;
  for (const model_detail::HostTensor* t :
       {&host.ln_attn, &host.w_qkv, &host.w_proj, &host.ln_mlp, &host.w_fc1, &host.w_fc2}) {
    names.push_back(t->name);
    counts.push_back(static_cast<int64_t>(t->values.size()));
    summed_over_tp.push_back(t->sum_gradient_over_tp);
    whole.insert(whole.end(), t->values.begin(), t->values.end());
  }
  FsdpLayout layout(std::move(names), std::move(counts), dp, std::move(summed_over_tp));
  const std::vector<float> shard = layout.shard_of(whole, dp_rank);
  model_detail::FsdpLayer<B> sharded{.layout = layout,
                                     .name = fmt::format("layers.{}.fsdp_shard", layer),
                                     .values = nullptr,
                                     .gradient = nullptr,
                                     .micro_batches = {}};
  sharded.values = memory.template allocate<float>(layout.shard());
  memory.upload(shard.data(), sharded.values, layout.shard());
  sharded.gradient = memory.template allocate<float>(layout.shard());
  fsdp_layers.emplace(layer, std::move(sharded));
}

template <class B>
BasicBoundOp<B> BasicStageModel<B>::Impl::bind_fsdp_op(const OpRef& ref, const std::string& op,
                                                       bool repeated) {
  using model_detail::FsdpUse;
  auto found = fsdp_layers.find(ref.layer);
  if (found == fsdp_layers.end()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {} of layer {}: rank {} holds no FSDP shard of that "
                            "layer (a plan without options.fsdp, or another stage's layer)",
                            ref.op, ref.layer, rank));
  }
  model_detail::FsdpLayer<B>& sharded = found->second;
  // The repeated forward of full recompute gathers nothing: it reads the backward's weights
  // (lib/dag_builder_recompute.cc), so bwd.recompute.fsdp_gather is no op of a plan.
  if (repeated) model_detail::throw_unknown_op(ref.op);
  if (op == "fwd.fsdp_gather") {
    return model_detail::fsdp_gather_op<B>(
        sharded, fsdp_gathered(ref.micro_batch, ref.layer, FsdpUse::kForward));
  }
  if (op == "bwd.fsdp_gather") {
    if (!fsdp.reshard_after_forward) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: op {} of layer {}: the plan keeps the gathered weights "
                              "(fsdp.reshard_after_forward false) yet gathers them again",
                              ref.op, ref.layer));
    }
    return model_detail::fsdp_gather_op<B>(
        sharded, fsdp_gathered(ref.micro_batch, ref.layer, FsdpUse::kBackward));
  }
  DHELIX_CHECK(op == "bwd.fsdp_reduce_scatter");
  model_detail::FsdpMicroBatch& state = sharded.micro_batches[ref.micro_batch];
  if (state.reduced == nullptr)
    state.reduced = memory.template allocate<float>(sharded.layout.shard());
  return model_detail::fsdp_reduce_scatter_op<B>(
      sharded, state, fsdp_gathered(ref.micro_batch, ref.layer, FsdpUse::kBackward).gradient,
      ref.layer, ref.micro_batch);
}

// A layer op of a sharded layer: the first gradient writer of the micro-batch's backward
// zeroes the whole gradient; the last readers of a set of weights release it.
template <class B>
void BasicStageModel<B>::Impl::wrap_fsdp_layer_op(BasicBoundOp<B>& bound, const OpRef& ref,
                                                  const std::string& op,
                                                  model_detail::FsdpUse use) {
  using model_detail::FsdpUse;
  if (!bound.compute) return;
  model_detail::FsdpLayer<B>& sharded = fsdp_layers.at(ref.layer);
  model_detail::FsdpGathered<B>& set = fsdp_gathered(ref.micro_batch, ref.layer, use);
  const int64_t padded = sharded.layout.padded();
  const auto release_weights = [weights = set.weights, compute = set.compute,
                                padded](const typename B::Exec& e) {
    model_detail::fsdp_release<B>(e, weights, compute, padded);
  };
  const auto none = [](const typename B::Exec&) {};
  const bool repeated = ref.op.starts_with("bwd.recompute.");
  if (op == "fwd.bda_mlp" && use == FsdpUse::kForward && fsdp.reshard_after_forward) {
    // The forward's last op: its weights are released (not the repeat's: the backward still
    // reads them).
    model_detail::fsdp_wrap<B>(bound, none, release_weights);
    return;
  }
  const bool writes_gradient =
      op == "bwd.ln_attn" || (!repeated && !gradients_written_by(op, ref.layer).empty());
  if (!writes_gradient) return;
  // The first gradient writer of the micro-batch's backward zeroes the whole gradient.
  model_detail::FsdpMicroBatch& state = sharded.micro_batches[ref.micro_batch];
  const auto zero_gradient = [&state, gradient = set.gradient, padded](const typename B::Exec& e) {
    if (!state.gradient_live) B::fsdp_fill(e, gradient, padded * 4, 0);
    state.gradient_live = true;
  };
  if (op == "bwd.ln_attn") {
    // The layer's last op reading weights; it also writes ln_attn's gradient.
    model_detail::fsdp_wrap<B>(bound, zero_gradient, release_weights);
  } else {
    model_detail::fsdp_wrap<B>(bound, zero_gradient, none);
  }
}

template <class B>
void BasicStageModel<B>::finish_iteration(const typename B::Exec& exec) {
  Impl& m = *impl_;
  for (auto& [layer, sharded] : m.fsdp_layers) {
    const int64_t s = sharded.layout.shard();
    for (int64_t mb = 0; mb < static_cast<int64_t>(m.loss_ran.size()); ++mb) {
      auto found = sharded.micro_batches.find(mb);
      if (found == sharded.micro_batches.end() || !found->second.reduce_scattered) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("FSDP: layer {} micro-batch {}: its gradient was not "
                                "reduce-scattered this iteration (no bwd.fsdp_reduce_scatter ran)",
                                layer, mb));
      }
      found->second.reduce_scattered = false;
      B::fsdp_accumulate(exec, s, found->second.reduced, sharded.gradient);
    }
  }
}

template <class B>
int64_t BasicStageModel<B>::fsdp_reduced_elements() const {
  int64_t elements = 0;
  for (const auto& [layer, sharded] : impl_->fsdp_layers) {
    elements += sharded.layout.shard() * static_cast<int64_t>(sharded.micro_batches.size());
  }
  return elements;
}

template <class B>
const FsdpLayout* BasicStageModel<B>::fsdp_layout(const std::string& name) const {
  for (const auto& [layer, sharded] : impl_->fsdp_layers) {
    if (sharded.name == name) return &sharded.layout;
  }
  return nullptr;
}

}  // namespace dhelix::rt
