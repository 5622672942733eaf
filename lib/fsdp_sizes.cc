#include "lib/fsdp_sizes.h"

#include <set>

#include "lib/int_math.h"

namespace dhelix {
namespace {

// One layer's expert weights, all E experts, unsplit.
int64_t all_expert_parameters(const ModelSpec& model) {
  if (!model.is_moe()) return 0;
  return model.moe->num_experts *
         mlp_parameter_count(model, model.moe->expert_ffn_hidden_size, false);
}

// The router's weights, replicated on every rank (h x E).
int64_t router_parameters(const ModelSpec& model) {
  return model.is_moe() ? model.hidden_size * model.moe->num_experts : 0;
}

}  // namespace

int64_t fsdp_layer_parameters(const ModelSpec& model, const ParallelSpec& parallel) {
  const int64_t whole = 2 * norm_parameter_count(model) + router_parameters(model);
  const int64_t split = layer_parameter_count(model) - whole - all_expert_parameters(model);
  return ceil_div(split, parallel.tp) + whole;
}

int64_t fsdp_expert_parameters(const ModelSpec& model, const ParallelSpec& parallel) {
  return ceil_div(all_expert_parameters(model), parallel.ep * parallel.expert_tp_size());
}

int64_t fsdp_expert_data_parallel_size(const ParallelSpec& parallel) {
  return parallel.dp * parallel.cp * parallel.tp / (parallel.ep * parallel.expert_tp_size());
}

ProcessGroup fsdp_expert_group(const Placement& placement, const ParallelSpec& parallel,
                               int64_t rank) {
  const RankCoordinates own = placement.coordinates(rank);
  const bool split_over_tp = parallel.expert_tp_size() > 1;
  ProcessGroup group;
  group.dim = ParallelDim::kDp;
  std::set<int64_t> nodes;
  for (int64_t member = 0; member < placement.world_size(); ++member) {
    const RankCoordinates c = placement.coordinates(member);
    if (c.pp == own.pp && c.ep == own.ep && (!split_over_tp || c.tp == own.tp)) {
      group.ranks.push_back(member);
      nodes.insert(placement.node_of(member));
    }
  }
  group.nodes_spanned = static_cast<int64_t>(nodes.size());
  group.scope = group.nodes_spanned == 1 ? GroupScope::kLocal : GroupScope::kCrossNode;
  return group;
}

bool fsdp_shards_experts(const ModelSpec& model, const ParallelSpec& parallel) {
  return parallel.fsdp_shards_parameters() && model.is_moe() &&
         fsdp_expert_data_parallel_size(parallel) > 1;
}

DType fsdp_gradient_dtype(const ParallelSpec& parallel) {
  return parallel.grad_reduce_in_bf16 ? DType::kBf16 : DType::kFp32;
}

int64_t fsdp_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(model.dtype) * fsdp_layer_parameters(model, parallel);
}

int64_t fsdp_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(fsdp_gradient_dtype(parallel)) * fsdp_layer_parameters(model, parallel);
}

int64_t fsdp_expert_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(model.dtype) * fsdp_expert_parameters(model, parallel);
}

int64_t fsdp_expert_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(fsdp_gradient_dtype(parallel)) * fsdp_expert_parameters(model, parallel);
}

}  // namespace dhelix
