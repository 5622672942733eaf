#include "planner/fsdp_si_prefetch.h"

namespace dhelix {

double fsdp_pair_slowdown(const StrandGraph& forward, const StrandGraph& backward,
                          const CoRunModel& co_run) {
  const StrandGraph* graphs[] = {&forward, &backward};
  double fsdp_us = 0, compute_us = 0;
  for (const StrandGraph* graph : graphs) {
    for (const StrandOp& op : graph->ops()) {
      if (op.fsdp_collective) fsdp_us += op.solo_time_us;
      if (!op.fsdp_collective && op.stream == StreamClass::kCompute) compute_us += op.solo_time_us;
    }
  }
  if (fsdp_us <= 0 || compute_us <= 0) return 0;
  double slowdown = 0;
  for (const StrandGraph* cg : graphs) {
    for (const StrandOp& c : cg->ops()) {
      if (c.fsdp_collective || c.stream != StreamClass::kCompute) continue;
      for (const StrandGraph* gg : graphs) {
        for (const StrandOp& g : gg->ops()) {
          if (!g.fsdp_collective) continue;
          slowdown += (c.solo_time_us / compute_us) * (g.solo_time_us / fsdp_us) *
                      (1.0 / co_run.rate(c, g) - 1.0);
        }
      }
    }
  }
  return slowdown;
}

FsdpPassCollectives si_block_collectives(const FsdpPassCollectives& forward,
                                         const FsdpPassCollectives& backward, double slowdown,
                                         int64_t layer_pairs) {
  const auto n = static_cast<double>(layer_pairs);
  return {.fsdp_us = n * (forward.fsdp_us + backward.fsdp_us),
          .same_stream_us = n * (forward.same_stream_us + backward.same_stream_us),
          .slowdown = slowdown};
}

PrefetchedStrand prefetched_si_block(double paired_without_fsdp_us,
                                     const FsdpPassCollectives& collectives) {
  return prefetched_strand(paired_without_fsdp_us, collectives);
}

}  // namespace dhelix
