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

// List scheduling: the ready op of `stream` with the highest priority; the backward
// strand is scanned first and a later candidate must be strictly better, which implements
// the tie rules. Returns the combined op (forward i = i, backward j = nf + j), -1 when none.
inline int64_t best_ready(const OpMask (&ready)[2][kNumStreams], int stream, int64_t nf,
                          const double* const (&priority)[2]) {
  int64_t best = -1;
  double best_priority = 0;
  for (int k = 1; k >= 0; --k) {
    const int64_t base = k == 0 ? 0 : nf;
    for (OpMask m = ready[k][stream]; m != 0; m &= m - 1) {
      const int i = __builtin_ctzll(m);
      const double p = priority[k][i];
      if (best < 0 || p > best_priority) {
        best = base + i;
        best_priority = p;
      }
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
                               const CoRunModel& model, LayerPeriods periods,
                               double paired_block_gap_us)
    : forward_(&forward),
      backward_(&backward),
      num_forward_(forward.size()),
      num_ops_(forward.size() + backward.size()),
      paired_gap_us_(paired_block_gap_us) {
  DHELIX_CHECK_MSG(paired_block_gap_us >= 0, "a block's launch interval must be >= 0");
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
  for (int64_t u = 0; u < num_ops_; ++u) {
    const bool is_forward = u < num_forward_;
    const StrandGraph& g = is_forward ? forward : backward;
    const int64_t i = is_forward ? u : u - num_forward_;
    solo_us_.push_back(g.op(i).solo_time_us);
    stream_.push_back(stream_index(g.op(i).stream));
    successors_.push_back(g.successor_mask(i));
    predecessors_.push_back(g.predecessor_mask(i));
  }
  if (is_periodic(periods)) period_ = {periods.forward_ops, periods.backward_ops};
  load_bound_ = CoRunLoadBound(stream_pair_max_rates());
}

// Exact comparison on purpose: the symmetry must hold bit for bit, or costs could differ.
bool BlockCostModel::is_periodic(LayerPeriods periods) const {
  const int64_t p[2] = {periods.forward_ops, periods.backward_ops};
  const int64_t base[2] = {0, num_forward_};
  const int64_t size[2] = {num_forward_, num_ops_ - num_forward_};
  if (p[0] <= 0 || p[1] <= 0 || size[0] % p[0] != 0 || size[1] % p[1] != 0) return false;
  const auto strand_of = [&](int64_t u) { return u < num_forward_ ? 0 : 1; };
  for (int64_t u = 0; u < num_ops_; ++u) {
    const int k = strand_of(u);
    if (u - base[k] < p[k]) continue;
    const int64_t v = u - p[k];  // the same op one layer earlier
    if (solo_us_[u] != solo_us_[v] || stream_[u] != stream_[v] ||
        (predecessors_[u] >> p[k]) != predecessors_[v]) {
      return false;
    }
    for (int64_t w = 0; w < num_ops_; ++w) {
      if (w == u) continue;
      if (strand_of(w) != k) {  // the strands shift independently
        if (rates_[u * num_ops_ + w] != rates_[v * num_ops_ + w] ||
            rates_[w * num_ops_ + u] != rates_[w * num_ops_ + v]) {
          return false;
        }
      } else if (w - base[k] >= p[k] &&
                 (rates_[u * num_ops_ + w] != rates_[v * num_ops_ + w - p[k]])) {  // together
        return false;
      }
    }
  }
  return true;
}

const StrandGraph& BlockCostModel::graph(Strand strand) const {
  return strand == Strand::kForward ? *forward_ : *backward_;
}

double BlockCostModel::pair_rate(Strand sa, int64_t a, Strand sb, int64_t b) const {
  const int64_t ua = sa == Strand::kForward ? a : forward_->size() + a;
  const int64_t ub = sb == Strand::kForward ? b : forward_->size() + b;
  return ua == ub ? 1.0 : rates_[ua * num_ops_ + ub];
}

std::array<std::array<double, 3>, 3> BlockCostModel::stream_pair_max_rates() const {
  std::array<std::array<double, 3>, 3> r{};
  for (int s = 0; s < kNumStreams; ++s) r[s][s] = 1;
  for (int64_t a = 0; a < num_ops_; ++a) {
    if (solo_us_[a] <= 0) continue;
    for (int64_t b = 0; b < num_ops_; ++b) {
      if (b == a || solo_us_[b] <= 0 || stream_[a] == stream_[b]) continue;
      r[stream_[a]][stream_[b]] = std::max(r[stream_[a]][stream_[b]], rates_[a * num_ops_ + b]);
    }
  }
  return r;
}

// Longest solo-time path from each op of `ops` to the block's end, through ops of `ops`
// only. Indices are topological, so one sweep from the highest index suffices.
BlockSide BlockCostModel::prepare_side(Strand strand, OpMask ops, double* priority) const {
  const int64_t base = strand == Strand::kForward ? 0 : num_forward_;
  DHELIX_CHECK((ops & ~graph(strand).all_ops()) == 0);
  BlockSide side;
  side.ops = ops;
  side.priority = priority;
  for (OpMask m = ops; m != 0;) {
    const int i = 63 - __builtin_clzll(m);
    m &= ~(OpMask{1} << i);
    const int64_t u = base + i;
    double longest_successor = 0;
    for (OpMask s = successors_[u] & ops; s != 0; s &= s - 1) {
      longest_successor = std::max(longest_successor, priority[__builtin_ctzll(s)]);
    }
    priority[i] = solo_us_[u] + longest_successor;
    if ((predecessors_[u] & ops) == 0) side.ready[stream_[u]] |= OpMask{1} << i;
  }
  for (OpMask m = ops; m != 0; m &= m - 1) {  // in index order, as the lattice sums loads
    const int64_t u = base + __builtin_ctzll(m);
    side.load_us[stream_[u]] += solo_us_[u];
  }
  return side;
}

double BlockCostModel::cost_us(OpMask forward_ops, OpMask backward_ops) const {
  std::array<double, kMaxStrandOps> fp, bp;
  return run(prepare_side(Strand::kForward, forward_ops, fp.data()),
             prepare_side(Strand::kBackward, backward_ops, bp.data()), nullptr, nullptr);
}

double BlockCostModel::cost_us(const BlockSide& forward, const BlockSide& backward) const {
  return run(forward, backward, nullptr, nullptr);
}

double BlockCostModel::bounded_cost_us(const BlockSide& forward, const BlockSide& backward,
                                       double give_up_us, bool* exact) const {
  return run(forward, backward, nullptr, nullptr, give_up_us, exact);
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
  std::array<double, kMaxStrandOps> fp, bp;
  BlockSimulation sim;
  sim.time_us = run(prepare_side(Strand::kForward, forward_ops, fp.data()),
                    prepare_side(Strand::kBackward, backward_ops, bp.data()), nullptr, &sim);
  sort_by_start(sim);
  return sim;
}

BlockSimulation BlockCostModel::simulate_in_order(OpMask forward_ops, OpMask backward_ops,
                                                  const std::vector<int64_t>& issue_rank) const {
  DHELIX_CHECK(static_cast<int64_t>(issue_rank.size()) == num_ops_);
  std::array<double, kMaxStrandOps> fp, bp;
  BlockSimulation sim;
  sim.time_us =
      run(prepare_side(Strand::kForward, forward_ops, fp.data()),
          prepare_side(Strand::kBackward, backward_ops, bp.data()), issue_rank.data(), &sim);
  sort_by_start(sim);
  return sim;
}

// Event simulation. Combined op index u: forward op i is u = i, backward op j is
// u = nf + j. Between two events the set of running ops, hence every rate, is constant,
// so the next event is the earliest finish at the current rates. An op becomes ready when
// its last predecessor inside the block finishes. With a finite give_up_us, `left_us`
// tracks each stream's work still to do, and after each event the block's time is bounded
// below by the time so far plus load_bound_ of that work (the bound holds for any stretch
// of a block): once that reaches give_up_us the rest need not be simulated.
double BlockCostModel::run(const BlockSide& forward, const BlockSide& backward,
                           const int64_t* issue_rank, BlockSimulation* out, double give_up_us,
                           bool* exact) const {
  // The two modes and the early stop as template arguments: their tests leave the loop.
  const bool may_give_up = give_up_us < kNoGiveUp;
  if (issue_rank != nullptr) {
    return may_give_up ? run_as<true, true>(forward, backward, issue_rank, out, give_up_us, exact)
                       : run_as<true, false>(forward, backward, issue_rank, out, give_up_us, exact);
  }
  return may_give_up ? run_as<false, true>(forward, backward, issue_rank, out, give_up_us, exact)
                     : run_as<false, false>(forward, backward, issue_rank, out, give_up_us, exact);
}

template <bool kInOrder, bool kMayGiveUp>
double BlockCostModel::run_as(const BlockSide& forward, const BlockSide& backward,
                              const int64_t* issue_rank, BlockSimulation* out, double give_up_us,
                              bool* exact) const {
  if (exact != nullptr) *exact = true;
  constexpr bool may_give_up = kMayGiveUp;
  std::array<double, kNumStreams> left_us{};
  if (may_give_up) {
    for (int s = 0; s < kNumStreams; ++s) left_us[s] = forward.load_us[s] + backward.load_us[s];
  }
  const int64_t nf = num_forward_;
  const OpMask masks[2] = {forward.ops, backward.ops};
  const double* const priority[2] = {forward.priority, backward.priority};
  double remaining_us[kNumStreams] = {0, 0, 0};  // of the op each stream runs
  std::array<double, kMaxBlockOps> start_us;     // read only with `out`
  OpMask ready[2][kNumStreams];
  OpMask unstarted[2][kNumStreams] = {};  // in-order mode: a stream's queue
  OpMask unfinished[2] = {masks[0], masks[1]};
  for (int k = 0; k < 2; ++k) {
    const BlockSide& side = k == 0 ? forward : backward;
    for (int s = 0; s < kNumStreams; ++s) ready[k][s] = side.ready[s];
    if (!kInOrder) continue;
    for (OpMask m = masks[k]; m != 0; m &= m - 1) {
      unstarted[k][stream_[(k == 0 ? 0 : nf) + __builtin_ctzll(m)]] |= m & -m;
    }
  }

  int64_t running[kNumStreams] = {-1, -1, -1};
  // A paired segment waits for its launch interval before any op starts; the host launches
  // its compute ops one interval apart, then its collectives (the file comment).
  const bool paired = forward.ops != 0 && backward.ops != 0;
  const bool host_launched = paired && paired_gap_us_ > 0;
  double now_us = paired ? paired_gap_us_ : 0;
  int64_t compute_ops = 0;
  if (host_launched) {
    for (int k = 0; k < 2; ++k) {
      for (OpMask m = masks[k]; m != 0; m &= m - 1) {
        compute_ops += stream_[(k == 0 ? 0 : nf) + __builtin_ctzll(m)] == 0 ? 1 : 0;
      }
    }
  }
  int64_t compute_launched = 0;  // compute ops started so far (the stream runs them in order)
  int64_t comm_launched = 0;     // collectives started so far, on either comm stream
  // When the host has launched the next op of stream s: compute op k (from 0) at g · (k + 1),
  // collective j at g · (1 + compute_ops + j).
  const auto launched_at_us = [&](int s) {
    const int64_t before = s == 0 ? compute_launched : compute_ops + comm_launched;
    return paired_gap_us_ * static_cast<double>(1 + before);
  };
  while ((unfinished[0] | unfinished[1]) != 0) {
    // Idle streams start their next op (best ready one, or their queue's head).
    int busy = 0;
    double next_launch_us = std::numeric_limits<double>::infinity();  // of an op held back
    for (int s = 0; s < kNumStreams; ++s) {
      if (host_launched && running[s] < 0 && (ready[0][s] | ready[1][s]) != 0 &&
          now_us < launched_at_us(s)) {
        next_launch_us = std::min(next_launch_us, launched_at_us(s));
        continue;
      }
      if (running[s] < 0 && (ready[0][s] | ready[1][s]) != 0) {
        const int64_t best = !kInOrder ? best_ready(ready, s, nf, priority)
                                       : queue_head_if_ready(unstarted, ready, s, nf, issue_rank);
        if (best >= 0) {
          const int k = best < nf ? 0 : 1;
          ready[k][s] &= ~(OpMask{1} << (best - (k == 0 ? 0 : nf)));
          if (kInOrder) unstarted[k][s] &= ~(OpMask{1} << (best - (k == 0 ? 0 : nf)));
          running[s] = best;
          ++(s == 0 ? compute_launched : comm_launched);
          if (out != nullptr) start_us[best] = now_us;
          remaining_us[s] = solo_us_[best];
        }
      }
      busy += running[s] >= 0 ? 1 : 0;
    }

    // Rates: the product over the other running ops (1 when alone, where the division
    // and the products are skipped: x / 1 and 1 * x are exact).
    double rate[kNumStreams] = {1, 1, 1};
    double step_us = std::numeric_limits<double>::infinity();
    int first = -1;
    // Unrolled: with two ops running, a rate is the one entry (1 * x = x); with three,
    // the two entries in stream order (1 * x * y = x * y), as the general product gives.
    if (busy > 1) {
      const double* const r = rates_.data();
      const int64_t n = num_ops_;
      const int64_t a = running[0], b = running[1], c = running[2];
      if (busy == 3) {
        rate[0] = r[a * n + b] * r[a * n + c];
        rate[1] = r[b * n + a] * r[b * n + c];
        rate[2] = r[c * n + a] * r[c * n + b];
      } else if (a < 0) {
        rate[1] = r[b * n + c];
        rate[2] = r[c * n + b];
      } else if (b < 0) {
        rate[0] = r[a * n + c];
        rate[2] = r[c * n + a];
      } else {
        rate[0] = r[a * n + b];
        rate[1] = r[b * n + a];
      }
    }
    for (int s = 0; s < kNumStreams; ++s) {
      if (running[s] < 0) continue;
      const double to_finish = busy > 1 ? remaining_us[s] / rate[s] : remaining_us[s];
      if (to_finish < step_us) {
        step_us = to_finish;
        first = s;
      }
    }
    const bool held_back = next_launch_us < std::numeric_limits<double>::infinity();
    if (held_back && next_launch_us - now_us < step_us) {
      step_us = next_launch_us - now_us;  // the next event is an op's launch
      first = -1;
    }
    DHELIX_CHECK_MSG(first >= 0 || held_back, "block simulation stalled: ops left but none ready");
    // A launch event lands exactly on its time (now + (t - now) may miss t by rounding).
    now_us = first < 0 ? next_launch_us : now_us + step_us;

    for (int s = 0; s < kNumStreams; ++s) {
      const int64_t u = running[s];
      if (u < 0) continue;
      const double done_us = rate[s] * step_us;
      if (may_give_up) left_us[s] -= done_us;
      remaining_us[s] -= done_us;
      // Ops ending at the same instant as the first one (up to rounding) end now too.
      if (s != first && remaining_us[s] > 1e-12 * solo_us_[u]) continue;
      const int k = u < nf ? 0 : 1;
      const int64_t base = k == 0 ? 0 : nf;
      const int i = static_cast<int>(u - base);
      running[s] = -1;
      unfinished[k] &= ~(OpMask{1} << i);
      for (OpMask m = successors_[u] & masks[k]; m != 0; m &= m - 1) {
        const int64_t v = base + __builtin_ctzll(m);
        if ((predecessors_[v] & unfinished[k]) == 0) ready[k][stream_[v]] |= m & -m;
      }
      if (out != nullptr) {
        out->ops.push_back(
            OpTiming{k == 0 ? Strand::kForward : Strand::kBackward, i, start_us[u], now_us});
      }
    }
    if (may_give_up && (unfinished[0] | unfinished[1]) != 0) {
      const double bound_us = now_us + load_bound_.bound_us(left_us);
      if (bound_us >= give_up_us) {
        *exact = false;
        return bound_us;
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
