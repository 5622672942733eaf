#include "planner/brute_force_pairing.h"

#include <algorithm>
#include <limits>
#include <map>

#include "lib/error.h"

namespace dhelix {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

void collect_orders(const StrandGraph& graph, OpMask done, std::vector<int64_t>* prefix,
                    int64_t max_count, std::vector<std::vector<int64_t>>* out) {
  if (static_cast<int64_t>(out->size()) >= max_count) return;
  if (static_cast<int64_t>(prefix->size()) == graph.size()) {
    out->push_back(*prefix);
    return;
  }
  for (int64_t i = 0; i < graph.size(); ++i) {
    const OpMask bit = OpMask{1} << i;
    if ((done & bit) != 0 || (graph.predecessor_mask(i) & ~done) != 0) continue;
    prefix->push_back(i);
    collect_orders(graph, done | bit, prefix, max_count, out);
    prefix->pop_back();
  }
}

int64_t count_orders(const StrandGraph& graph, OpMask done, std::map<OpMask, int64_t>* memo) {
  if (done == graph.all_ops()) return 1;
  if (auto it = memo->find(done); it != memo->end()) return it->second;
  int64_t count = 0;
  for (int64_t i = 0; i < graph.size(); ++i) {
    const OpMask bit = OpMask{1} << i;
    if ((done & bit) != 0 || (graph.predecessor_mask(i) & ~done) != 0) continue;
    const int64_t sub = count_orders(graph, done | bit, memo);
    count = sub > std::numeric_limits<int64_t>::max() - count ? std::numeric_limits<int64_t>::max()
                                                              : count + sub;
  }
  (*memo)[done] = count;
  return count;
}

// Masks of the ops at positions [begin, end) of an order.
OpMask segment_mask(const std::vector<int64_t>& order, int64_t begin, int64_t end) {
  OpMask mask = 0;
  for (int64_t p = begin; p < end; ++p) mask |= OpMask{1} << order[p];
  return mask;
}

// Explicit enumeration of every segmentation x alignment of one order pair: each leaf is
// one complete plan, costed along its own path.
class PlanEnumerator {
 public:
  PlanEnumerator(BlockCostCache& cache, const std::vector<int64_t>& forward,
                 const std::vector<int64_t>& backward, int64_t max_segment_ops)
      : cache_(cache), forward_(forward), backward_(backward), bound_(max_segment_ops) {}

  void run(int64_t pf, int64_t pb, double cost_us, double* best_us, int64_t* plans) {
    const int64_t nf = static_cast<int64_t>(forward_.size());
    const int64_t nb = static_cast<int64_t>(backward_.size());
    if (pf == nf && pb == nb) {
      ++*plans;
      *best_us = std::min(*best_us, cost_us);
      return;
    }
    const int64_t max_a = bound_ > 0 ? std::min(nf - pf, bound_) : nf - pf;
    const int64_t max_b = bound_ > 0 ? std::min(nb - pb, bound_) : nb - pb;
    for (int64_t a = 0; a <= max_a; ++a) {
      for (int64_t b = 0; b <= max_b; ++b) {
        if (a == 0 && b == 0) continue;
        const double block =
            cache_.cost_us(segment_mask(forward_, pf, pf + a), segment_mask(backward_, pb, pb + b));
        run(pf + a, pb + b, cost_us + block, best_us, plans);
      }
    }
  }

 private:
  BlockCostCache& cache_;
  const std::vector<int64_t>& forward_;
  const std::vector<int64_t>& backward_;
  int64_t bound_;
};

// The paper's three-move DP over contiguous segments of one order pair.
double order_pair_dp(BlockCostCache& cache, const std::vector<int64_t>& forward,
                     const std::vector<int64_t>& backward, int64_t bound) {
  const int64_t nf = static_cast<int64_t>(forward.size());
  const int64_t nb = static_cast<int64_t>(backward.size());
  std::vector<double> t((nf + 1) * (nb + 1), kInfinity);
  t[0] = 0;
  for (int64_t i = 0; i <= nf; ++i) {
    for (int64_t j = 0; j <= nb; ++j) {
      const double here = t[i * (nb + 1) + j];
      const int64_t max_a = bound > 0 ? std::min(nf - i, bound) : nf - i;
      const int64_t max_b = bound > 0 ? std::min(nb - j, bound) : nb - j;
      for (int64_t a = 0; a <= max_a; ++a) {
        const OpMask fmask = segment_mask(forward, i, i + a);
        for (int64_t b = 0; b <= max_b; ++b) {
          if (a == 0 && b == 0) continue;
          double& there = t[(i + a) * (nb + 1) + j + b];
          there = std::min(there, here + cache.cost_us(fmask, segment_mask(backward, j, j + b)));
        }
      }
    }
  }
  return t.back();
}

}  // namespace

std::vector<std::vector<int64_t>> enumerate_topological_orders(const StrandGraph& graph,
                                                               int64_t max_count) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> prefix;
  collect_orders(graph, 0, &prefix, max_count, &out);
  return out;
}

int64_t count_topological_orders(const StrandGraph& graph) {
  std::map<OpMask, int64_t> memo;
  return count_orders(graph, 0, &memo);
}

BruteForceResult brute_force_pairing(const BlockCostModel& model, int64_t max_segment_ops) {
  DHELIX_CHECK(model.forward().size() <= kBruteForceMaxOps);
  DHELIX_CHECK(model.backward().size() <= kBruteForceMaxOps);
  BlockCostCache cache(model);
  const auto forward_orders = enumerate_topological_orders(model.forward(), 1 << 13);
  const auto backward_orders = enumerate_topological_orders(model.backward(), 1 << 13);
  BruteForceResult result;
  result.total_time_us = kInfinity;
  for (const auto& fo : forward_orders) {
    for (const auto& bo : backward_orders) {
      ++result.order_pairs;
      PlanEnumerator(cache, fo, bo, max_segment_ops)
          .run(0, 0, 0.0, &result.total_time_us, &result.plans);
    }
  }
  return result;
}

NaiveResult naive_order_pairing(const BlockCostModel& model, const NaiveOptions& options) {
  const int64_t cap = options.max_orders_per_strand > 0 ? options.max_orders_per_strand
                                                        : std::numeric_limits<int64_t>::max();
  BlockCostCache cache(model);
  const auto forward_orders = enumerate_topological_orders(model.forward(), cap);
  const auto backward_orders = enumerate_topological_orders(model.backward(), cap);
  NaiveResult result;
  result.total_time_us = kInfinity;
  result.forward_orders = static_cast<int64_t>(forward_orders.size());
  result.backward_orders = static_cast<int64_t>(backward_orders.size());
  result.forward_orders_total = count_topological_orders(model.forward());
  result.backward_orders_total = count_topological_orders(model.backward());
  result.complete = result.forward_orders == result.forward_orders_total &&
                    result.backward_orders == result.backward_orders_total;
  for (const auto& fo : forward_orders) {
    for (const auto& bo : backward_orders) {
      result.total_time_us =
          std::min(result.total_time_us, order_pair_dp(cache, fo, bo, options.max_segment_ops));
    }
  }
  return result;
}

}  // namespace dhelix
