// from_layer_dag lives apart from strand_graph.cc so that code using hand-built graphs
// does not link the LayerDag implementation.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <unordered_map>

#include "lib/error.h"
#include "planner/fsdp_prefetch.h"
#include "planner/strand_graph.h"

namespace dhelix {

double checked_solo_time_us(const Op& op, const std::function<double(const Op&)>& solo_time_us) {
  const double time_us = solo_time_us(op);
  if (!(std::isfinite(time_us) && time_us >= 0)) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("op {}: solo time {} us must be finite and non-negative", op.id, time_us));
  }
  return time_us;
}

StrandGraph from_layer_dag(const LayerDag& dag,
                           const std::function<double(const Op&)>& solo_time_us) {
  if (dag.size() > kMaxStrandOps) {
    throw Error(ErrorCode::kUnsupported,
                "layer DAG holds " + std::to_string(dag.size()) +
                    " ops; the pairing search handles at most 64 per strand");
  }
  StrandGraph graph;
  std::unordered_map<int64_t, int64_t> new_index;
  for (int64_t v : dag.topological_order()) {
    const Op& op = dag.op(v);
    const double time_us = checked_solo_time_us(op, solo_time_us);
    std::vector<int64_t> preds;
    for (int64_t p : dag.predecessors(v)) preds.push_back(new_index.at(p));
    new_index[v] =
        graph.add_op(op.id, op.stream, time_us, std::move(preds), op.signature(), is_fsdp_op(op));
  }
  return graph;
}

}  // namespace dhelix
