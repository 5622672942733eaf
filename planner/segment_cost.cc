#include "planner/segment_cost.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "lib/error.h"

namespace dhelix {

namespace {

constexpr int kNumStreams = 3;
constexpr int64_t kMaxBlockOps = 2 * kMaxStrandOps;

int stream_index(StreamClass stream) { return static_cast<int>(stream); }

// Longest solo-time path from each op of `mask` to the block's end, through ops of `mask`
// only. Indices are topological, so one backward sweep suffices.
void block_priorities(const StrandGraph& graph, OpMask mask, double* priority) {
  for (int64_t i = graph.size() - 1; i >= 0; --i) {
    if (((mask >> i) & 1) == 0) continue;
    double longest_successor = 0;
    for (OpMask s = graph.successor_mask(i) & mask; s != 0; s &= s - 1) {
      longest_successor = std::max(longest_successor, priority[__builtin_ctzll(s)]);
    }
    priority[i] = graph.op(i).solo_time_us + longest_successor;
  }
}

// List scheduling: the ready op of `stream` with the highest priority; the backward
// strand is scanned first and a later candidate must be strictly better, which implements
// the tie rules. -1 when none is ready.
int64_t best_ready(const OpMask (&ready)[2][kNumStreams], int stream, int64_t nf,
                   const double* priority) {
  int64_t best = -1;
  for (int k = 1; k >= 0; --k) {
    const int64_t base = k == 0 ? 0 : nf;
    for (OpMask m = ready[k][stream]; m != 0; m &= m - 1) {
      const int64_t u = base + __builtin_ctzll(m);
      if (best < 0 || priority[u] > priority[best]) best = u;
    }
  }
  return best;
}

// In-order execution: the unstarted op of `stream` with the lowest issue rank, if it is
// ready; -1 when the stream is empty or its head still waits for an input.
int64_t queue_head_if_ready(const OpMask (&unstarted)[2][kNumStreams],
                            const OpMask (&ready)[2][kNumStreams], int stream, int64_t nf,
                            const int64_t* issue_rank) {
  int64_t head = -1;
  for (int k = 0; k < 2; ++k) {
    const int64_t base = k == 0 ? 0 : nf;
    for (OpMask m = unstarted[k][stream]; m != 0; m &= m - 1) {
      const int64_t u = base + __builtin_ctzll(m);
      if (head < 0 || issue_rank[u] < issue_rank[head]) head = u;
    }
  }
  if (head < 0) return -1;
  const int k = head < nf ? 0 : 1;
  return ((ready[k][stream] >> (head - (k == 0 ? 0 : nf))) & 1) != 0 ? head : -1;
}

}  // namespace

BlockCostModel::BlockCostModel(const StrandGraph& forward, const StrandGraph& backward,
                               const CoRunModel& model)
    : forward_(&forward), backward_(&backward), num_ops_(forward.size() + backward.size()) {
  rates_.assign(static_cast<size_t>(num_ops_ * num_ops_), 1.0);
  auto op_at = [&](int64_t u) -> const StrandOp& {
    return u < forward.size() ? forward.op(u) : backward.op(u - forward.size());
  };
  for (int64_t a = 0; a < num_ops_; ++a) {
    for (int64_t b = 0; b < num_ops_; ++b) {
      if (a == b) continue;
      const double rate = model.rate(op_at(a), op_at(b));
      DHELIX_CHECK_MSG(rate > 0 && rate <= 1, "co-run rate must lie in (0, 1]");
      rates_[a * num_ops_ + b] = std::max(rate, kMinCoRunRate);
    }
  }
}

const StrandGraph& BlockCostModel::graph(Strand strand) const {
  return strand == Strand::kForward ? *forward_ : *backward_;
}

double BlockCostModel::pair_rate(Strand sa, int64_t a, Strand sb, int64_t b) const {
  const int64_t ua = sa == Strand::kForward ? a : forward_->size() + a;
  const int64_t ub = sb == Strand::kForward ? b : forward_->size() + b;
  return ua == ub ? 1.0 : rates_[ua * num_ops_ + ub];
}

double BlockCostModel::cost_us(OpMask forward_ops, OpMask backward_ops) const {
  return run(forward_ops, backward_ops, nullptr, nullptr);
}

namespace {
void sort_by_start(BlockSimulation& sim) {
  std::sort(sim.ops.begin(), sim.ops.end(), [](const OpTiming& x, const OpTiming& y) {
    if (x.start_us != y.start_us) return x.start_us < y.start_us;
    if (x.strand != y.strand) return x.strand == Strand::kBackward;
    return x.op < y.op;
  });
}
}  // namespace

BlockSimulation BlockCostModel::simulate(OpMask forward_ops, OpMask backward_ops) const {
  BlockSimulation sim;
  sim.time_us = run(forward_ops, backward_ops, nullptr, &sim);
  sort_by_start(sim);
  return sim;
}

BlockSimulation BlockCostModel::simulate_in_order(OpMask forward_ops, OpMask backward_ops,
                                                  const std::vector<int64_t>& issue_rank) const {
  DHELIX_CHECK(static_cast<int64_t>(issue_rank.size()) == num_ops_);
  BlockSimulation sim;
  sim.time_us = run(forward_ops, backward_ops, issue_rank.data(), &sim);
  sort_by_start(sim);
  return sim;
}

// Event simulation. Combined op index u: forward op i is u = i, backward op j is
// u = nf + j. Between two events the set of running ops, hence every rate, is constant,
// so the next event is the earliest finish at the current rates.
double BlockCostModel::run(OpMask forward_ops, OpMask backward_ops, const int64_t* issue_rank,
                           BlockSimulation* out) const {
  const int64_t nf = forward_->size();
  DHELIX_CHECK((forward_ops & ~forward_->all_ops()) == 0);
  DHELIX_CHECK((backward_ops & ~backward_->all_ops()) == 0);
  const StrandGraph* graphs[2] = {forward_, backward_};
  const OpMask masks[2] = {forward_ops, backward_ops};

  std::array<double, kMaxBlockOps> priority;
  std::array<double, kMaxBlockOps> remaining_us;
  std::array<double, kMaxBlockOps> start_us;
  std::array<int, kMaxBlockOps> pending;
  OpMask ready[2][kNumStreams] = {};
  OpMask unstarted[2][kNumStreams] = {};  // in-order mode: a stream's queue
  block_priorities(*forward_, forward_ops, priority.data());
  block_priorities(*backward_, backward_ops, priority.data() + nf);
  int64_t left = 0;
  for (int k = 0; k < 2; ++k) {
    const int64_t base = k == 0 ? 0 : nf;
    for (OpMask m = masks[k]; m != 0; m &= m - 1) {
      const int i = __builtin_ctzll(m);
      const StrandOp& op = graphs[k]->op(i);
      remaining_us[base + i] = op.solo_time_us;
      pending[base + i] = __builtin_popcountll(graphs[k]->predecessor_mask(i) & masks[k]);
      if (pending[base + i] == 0) ready[k][stream_index(op.stream)] |= OpMask{1} << i;
      unstarted[k][stream_index(op.stream)] |= OpMask{1} << i;
      ++left;
    }
  }

  int64_t running[kNumStreams] = {-1, -1, -1};
  double now_us = 0;
  while (left > 0) {
    // Idle streams start their next op (best ready one, or their queue's head).
    for (int s = 0; s < kNumStreams; ++s) {
      if (running[s] >= 0) continue;
      const int64_t best = issue_rank == nullptr
                               ? best_ready(ready, s, nf, priority.data())
                               : queue_head_if_ready(unstarted, ready, s, nf, issue_rank);
      if (best < 0) continue;
      const int k = best < nf ? 0 : 1;
      ready[k][s] &= ~(OpMask{1} << (best - (k == 0 ? 0 : nf)));
      unstarted[k][s] &= ~(OpMask{1} << (best - (k == 0 ? 0 : nf)));
      running[s] = best;
      start_us[best] = now_us;
    }

    double rate[kNumStreams] = {1, 1, 1};
    double step_us = std::numeric_limits<double>::infinity();
    int first = -1;
    for (int s = 0; s < kNumStreams; ++s) {
      if (running[s] < 0) continue;
      for (int o = 0; o < kNumStreams; ++o) {
        if (o != s && running[o] >= 0) rate[s] *= rates_[running[s] * num_ops_ + running[o]];
      }
      const double to_finish = remaining_us[running[s]] / rate[s];
      if (to_finish < step_us) {
        step_us = to_finish;
        first = s;
      }
    }
    DHELIX_CHECK_MSG(first >= 0, "block simulation stalled: ops left but none ready");
    now_us += step_us;

    for (int s = 0; s < kNumStreams; ++s) {
      const int64_t u = running[s];
      if (u < 0) continue;
      const int k = u < nf ? 0 : 1;
      const int64_t i = u - (k == 0 ? 0 : nf);
      const double solo_us = graphs[k]->op(i).solo_time_us;
      remaining_us[u] -= rate[s] * step_us;
      // Ops ending at the same instant as the first one (up to rounding) end now too.
      if (s != first && remaining_us[u] > 1e-12 * solo_us) continue;
      running[s] = -1;
      --left;
      for (OpMask m = graphs[k]->successor_mask(i) & masks[k]; m != 0; m &= m - 1) {
        const int j = __builtin_ctzll(m);
        const int64_t v = (k == 0 ? 0 : nf) + j;
        if (--pending[v] == 0) ready[k][stream_index(graphs[k]->op(j).stream)] |= OpMask{1} << j;
      }
      if (out != nullptr) {
        out->ops.push_back(
            OpTiming{k == 0 ? Strand::kForward : Strand::kBackward, i, start_us[u], now_us});
      }
    }
  }
  return now_us;
}

BlockCostCache::BlockCostCache(const BlockCostModel& model) : model_(&model) {
  entries_.resize(1 << 12);
}

namespace {
size_t slot_of(OpMask forward_ops, OpMask backward_ops, size_t capacity) {
  uint64_t h = forward_ops * 0x9E3779B97F4A7C15ULL;
  h ^= (backward_ops + 0x632BE59BD9B4E019ULL) * 0xC2B2AE3D27D4EB4FULL;
  h ^= h >> 29;
  return static_cast<size_t>(h) & (capacity - 1);
}
}  // namespace

double BlockCostCache::cost_us(OpMask forward_ops, OpMask backward_ops) {
  const size_t capacity = entries_.size();
  for (size_t i = slot_of(forward_ops, backward_ops, capacity);; i = (i + 1) & (capacity - 1)) {
    Entry& e = entries_[i];
    if (e.cost_us < 0) {
      e = Entry{forward_ops, backward_ops, model_->cost_us(forward_ops, backward_ops)};
      const double cost = e.cost_us;
      if (++size_ * 2 > static_cast<int64_t>(capacity)) grow();
      return cost;
    }
    if (e.forward_ops == forward_ops && e.backward_ops == backward_ops) return e.cost_us;
  }
}

void BlockCostCache::grow() {
  std::vector<Entry> old = std::move(entries_);
  entries_.assign(old.size() * 2, Entry{});
  const size_t capacity = entries_.size();
  for (const Entry& e : old) {
    if (e.cost_us < 0) continue;
    size_t i = slot_of(e.forward_ops, e.backward_ops, capacity);
    while (entries_[i].cost_us >= 0) i = (i + 1) & (capacity - 1);
    entries_[i] = e;
  }
}

}  // namespace dhelix
