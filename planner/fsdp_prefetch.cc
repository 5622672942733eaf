#include "planner/fsdp_prefetch.h"

#include <algorithm>
#include <optional>

namespace dhelix {

bool is_fsdp_op(const Op& op) {
  return is_communication(op.kind) && op.group == ParallelDim::kDp &&
         (op.id.starts_with("fwd.fsdp_") || op.id.starts_with("bwd.fsdp_"));
}

FsdpPassCollectives fsdp_pass_collectives(const LayerDag& dag,
                                          const std::function<double(const Op&)>& solo_time_us) {
  FsdpPassCollectives out;
  std::optional<StreamClass> stream;
  for (int64_t v = 0; v < dag.size(); ++v) {
    const Op& op = dag.op(v);
    if (!is_fsdp_op(op)) continue;
    out.fsdp_us += solo_time_us(op);
    stream = op.stream;
  }
  if (!stream) return out;
  for (int64_t v = 0; v < dag.size(); ++v) {
    const Op& op = dag.op(v);
    if (!is_fsdp_op(op) && op.stream == *stream) out.same_stream_us += solo_time_us(op);
  }
  return out;
}

PrefetchedStrand prefetched_strand(double without_fsdp_us, const FsdpPassCollectives& fsdp) {
  PrefetchedStrand out;
  out.time_us = std::max(without_fsdp_us, fsdp.same_stream_us + fsdp.fsdp_us);
  out.exposed_us = out.time_us - without_fsdp_us;
  out.hidden_us = fsdp.fsdp_us - out.exposed_us;
  return out;
}

LayerCosts with_fsdp_prefetch(LayerCosts plain, const FsdpPassCollectives& forward,
                              const FsdpPassCollectives& backward) {
  const PrefetchedStrand f = prefetched_strand(plain.forward_us, forward);
  const PrefetchedStrand b = prefetched_strand(plain.backward_us, backward);
  plain.forward_us = f.time_us;
  plain.backward_us = b.time_us;
  plain.forward_comm[ParallelDim::kDp].hidden_us += f.hidden_us;
  plain.forward_comm[ParallelDim::kDp].exposed_us += f.exposed_us;
  plain.backward_comm[ParallelDim::kDp].hidden_us += b.hidden_us;
  plain.backward_comm[ParallelDim::kDp].exposed_us += b.exposed_us;
  return plain;
}

}  // namespace dhelix
