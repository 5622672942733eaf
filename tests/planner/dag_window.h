#pragma once
// A window of a layer DAG as a StrandGraph small enough for the brute-force pairing
// (planner/brute_force_pairing.h): the exactness tests of ops a DAG builder adds (the CP
// all-to-alls, FSDP's gathers and reduce-scatters) compare the exact search with it there.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/cluster_spec.h"
#include "lib/layer_dag.h"
#include "planner/strand_graph.h"
#include "profiler/interference.h"

namespace dhelix::testing {

/// The ops of `dag` from `first` to `last` (inclusive) in its StrandGraph order, each timed
/// by the model backend on `cluster`, with the DAG's edges between them.
inline StrandGraph dag_window(const LayerDag& dag, const std::string& first,
                              const std::string& last, const ClusterSpec& cluster) {
  const StrandGraph whole =
      from_layer_dag(dag, [&cluster](const Op& op) { return op_time_us(cluster, op); });
  const int64_t begin = whole.find(first);
  const int64_t end = whole.find(last);
  StrandGraph out;
  for (int64_t i = begin; i <= end; ++i) {
    const StrandOp& op = whole.op(i);
    std::vector<int64_t> predecessors;
    for (int64_t p : op.predecessors) {
      if (p >= begin) predecessors.push_back(p - begin);
    }
    out.add_op(op.id, op.stream, op.solo_time_us, predecessors, op.cost_key);
  }
  return out;
}

}  // namespace dhelix::testing
