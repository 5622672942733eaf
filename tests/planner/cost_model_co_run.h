#pragma once
// A co-run model for tests on real layer DAGs: solo times and co-run rates straight from
// the analytic cost model (what the model profiler backend records), looked up by
// signature.

#include <functional>
#include <map>
#include <string>
#include <utility>

#include "lib/cluster_spec.h"
#include "lib/layer_dag.h"
#include "planner/co_run_model.h"
#include "profiler/interference.h"

namespace dhelix::testing {

class CostModelCoRun final : public CoRunModel {
 public:
  explicit CostModelCoRun(ClusterSpec cluster) : cluster_(std::move(cluster)) {}
  void add(const LayerDags& dags) {
    for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
      for (int64_t i = 0; i < dag->size(); ++i) ops_[dag->op(i).signature()] = dag->op(i);
    }
  }
  double rate(const StrandOp& a, const StrandOp& b) const override {
    return co_run_rates(cluster_, ops_.at(a.cost_key), ops_.at(b.cost_key)).rate_a;
  }
  std::function<double(const Op&)> solo() const {
    return [this](const Op& op) { return op_time_us(cluster_, op); };
  }

 private:
  ClusterSpec cluster_;
  std::map<std::string, Op> ops_;
};

}  // namespace dhelix::testing
