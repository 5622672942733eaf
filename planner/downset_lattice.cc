#include "planner/downset_lattice.h"

#include <algorithm>
#include <utility>

#include "lib/error.h"
#include "planner/pairing_search.h"
#include "planner/piece_shapes.h"

namespace dhelix {

namespace {

// Open addressing from an op set to a small index; sets are never removed.
class MaskIndex {
 public:
  explicit MaskIndex(int64_t expected) {
    size_t capacity = 16;
    while (capacity < static_cast<size_t>(expected) * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
  }
  // The index of `mask`, or `fresh` after inserting it with that index.
  int32_t find_or_insert(OpMask mask, int32_t fresh) {
    if ((size_ + 1) * 2 > static_cast<int64_t>(slots_.size())) grow();
    for (size_t i = slot_of(mask);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].index < 0) {
        slots_[i] = Slot{mask, fresh};
        ++size_;
        return fresh;
      }
      if (slots_[i].mask == mask) return slots_[i].index;
    }
  }
  int32_t find(OpMask mask) const {
    for (size_t i = slot_of(mask);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].index < 0 || slots_[i].mask == mask) return slots_[i].index;
    }
  }

 private:
  struct Slot {
    OpMask mask = 0;
    int32_t index = -1;
  };
  size_t slot_of(OpMask mask) const {
    uint64_t h = mask * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 31;
    return static_cast<size_t>(h) & (slots_.size() - 1);
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    size_ = 0;
    for (const Slot& s : old) {
      if (s.index >= 0) find_or_insert(s.mask, s.index);
    }
  }
  std::vector<Slot> slots_;
  int64_t size_ = 0;
};

void collect_downsets(const StrandGraph& graph, int64_t index, OpMask mask, int64_t max_count,
                      std::vector<OpMask>* out) {
  if (index == graph.size()) {
    if (static_cast<int64_t>(out->size()) >= max_count) {
      throw Error(ErrorCode::kUnsupported,
                  "exact pairing search refused: a strand of " + std::to_string(graph.size()) +
                      " ops has more than " + std::to_string(max_count) +
                      " downsets (too many ops with no order between them; n independent ops "
                      "have 2^n downsets)");
    }
    out->push_back(mask);
    return;
  }
  collect_downsets(graph, index + 1, mask, max_count, out);
  if ((graph.predecessor_mask(index) & ~mask) == 0) {
    collect_downsets(graph, index + 1, mask | (OpMask{1} << index), max_count, out);
  }
}

// Every downset containing `from` whose difference holds at most `bound` ops (0 = any):
// each op outside `from`, in index order, is left out or (when its predecessors are in)
// taken. `budget` counts down the steps still allowed (below zero: stop). `out` null:
// count only.
void collect_supersets(const StrandGraph& graph, int64_t index, OpMask mask, int64_t added,
                       int64_t bound, int64_t* budget, std::vector<OpMask>* out) {
  for (; index < graph.size() && ((mask >> index) & 1) != 0; ++index) {
  }
  if (*budget < 0) return;
  if (index == graph.size() || (bound > 0 && added == bound)) {
    --*budget;
    if (out != nullptr) out->push_back(mask);
    return;
  }
  collect_supersets(graph, index + 1, mask, added, bound, budget, out);
  if ((graph.predecessor_mask(index) & ~mask) == 0) {
    collect_supersets(graph, index + 1, mask | (OpMask{1} << index), added + 1, bound, budget, out);
  }
}

std::array<double, kNumStreamClasses> stream_loads(const StrandGraph& graph, OpMask mask) {
  std::array<double, kNumStreamClasses> load{};
  for (OpMask m = mask; m != 0; m &= m - 1) {
    const StrandOp& op = graph.op(__builtin_ctzll(m));
    load[static_cast<int>(op.stream)] += op.solo_time_us;
  }
  return load;
}

double longest_path_within(const StrandGraph& graph, OpMask mask) {
  std::array<double, kMaxStrandOps> tail;  // read only where written: successors come first
  double longest = 0;
  for (OpMask m = mask; m != 0;) {  // the ops of `mask` from the highest index down
    const int i = 63 - __builtin_clzll(m);
    m &= ~(OpMask{1} << i);
    double next = 0;
    for (OpMask s = graph.successor_mask(i) & mask; s != 0; s &= s - 1) {
      next = std::max(next, tail[__builtin_ctzll(s)]);
    }
    tail[i] = graph.op(i).solo_time_us + next;
    longest = std::max(longest, tail[i]);
  }
  return longest;
}

void add_piece(const StrandGraph& graph, OpMask piece, Lattice* lattice) {
  lattice->pieces.push_back(piece);
  lattice->piece_path_us.push_back(longest_path_within(graph, piece));
}

}  // namespace

std::vector<OpMask> enumerate_downsets(const StrandGraph& graph, int64_t max_count) {
  std::vector<OpMask> out;
  collect_downsets(graph, 0, 0, max_count, &out);
  std::sort(out.begin(), out.end(), [](OpMask a, OpMask b) {
    const int64_t sa = mask_size(a), sb = mask_size(b);
    return sa != sb ? sa < sb : a < b;
  });
  return out;
}

Lattice lattice_downsets(const BlockCostModel& model, Strand strand,
                         const PairingOptions& options) {
  const StrandGraph& graph = model.graph(strand);
  Lattice lattice;
  lattice.strand = strand;
  lattice.downsets = enumerate_downsets(graph, options.max_downsets);
  lattice.load_us.reserve(lattice.downsets.size());
  lattice.remaining_path_us.reserve(lattice.downsets.size());
  for (OpMask d : lattice.downsets) {
    lattice.load_us.push_back(stream_loads(graph, d));
    double remaining = 0;  // the complement is an upset: its longest path starts anywhere in it
    for (OpMask m = graph.all_ops() & ~d; m != 0; m &= m - 1) {
      remaining = std::max(remaining, graph.tail_time_us()[__builtin_ctzll(m)]);
    }
    lattice.remaining_path_us.push_back(remaining);
  }
  return lattice;
}

int64_t count_lattice_steps(const BlockCostModel& model, const Lattice& lattice,
                            int64_t max_segment_ops, int64_t cap) {
  const StrandGraph& graph = model.graph(lattice.strand);
  int64_t budget = cap;
  for (int64_t i = 0; i < lattice.size() && budget >= 0; ++i) {
    collect_supersets(graph, 0, lattice.downsets[static_cast<size_t>(i)], 0, max_segment_ops,
                      &budget, nullptr);
  }
  return budget < 0 ? cap + 1 : cap - budget;
}

void build_lattice_steps(const BlockCostModel& model, const PairingOptions& options,
                         Lattice* lattice) {
  const StrandGraph& graph = model.graph(lattice->strand);
  const int64_t n = lattice->size();
  MaskIndex downset_index(n);
  for (int64_t i = 0; i < n; ++i) {
    downset_index.find_or_insert(lattice->downsets[static_cast<size_t>(i)],
                                 static_cast<int32_t>(i));
  }
  MaskIndex piece_index(n);
  piece_index.find_or_insert(0, 0);
  PieceShapes shapes(model, lattice->strand);
  shapes.find_or_insert(0, 0);
  add_piece(graph, 0, lattice);

  // Count first (nothing stored), so that a strand past the limit costs no memory.
  int64_t budget = options.max_steps;
  for (int64_t i = 0; i < n && budget >= 0; ++i) {
    collect_supersets(graph, 0, lattice->downsets[static_cast<size_t>(i)], 0,
                      options.max_segment_ops, &budget, nullptr);
  }
  if (budget < 0) {
    throw Error(ErrorCode::kUnsupported,
                std::string("exact pairing search refused: the ") + strand_name(lattice->strand) +
                    " strand (" + std::to_string(graph.size()) + " ops, " + std::to_string(n) +
                    " downsets) has more than " + std::to_string(options.max_steps) +
                    " moves from a downset to a superset (too many ops with no order between "
                    "them; a segment bound, PairingOptions::max_segment_ops, reduces them)");
  }
  lattice->steps.reserve(static_cast<size_t>(options.max_steps - budget));
  std::vector<OpMask> supersets;
  std::vector<int32_t> targets;
  lattice->step_begin.assign(1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const OpMask from = lattice->downsets[static_cast<size_t>(i)];
    supersets.clear();
    int64_t unlimited = options.max_steps;
    collect_supersets(graph, 0, from, 0, options.max_segment_ops, &unlimited, &supersets);
    targets.clear();
    for (OpMask to : supersets) targets.push_back(downset_index.find(to));
    std::sort(targets.begin(), targets.end());
    for (int32_t target : targets) {
      const OpMask diff = lattice->downsets[static_cast<size_t>(target)] & ~from;
      const OpMask piece = model.canonical(lattice->strand, diff);
      int32_t id = piece_index.find(piece);
      if (id < 0) {  // a new op set: a new piece unless one of its shape is known
        const auto fresh = static_cast<int32_t>(lattice->pieces.size());
        id = shapes.find_or_insert(piece, fresh);
        piece_index.find_or_insert(piece, id);
        if (id == fresh) add_piece(graph, piece, lattice);
      }
      lattice->steps.push_back(LatticeStep{target, id});
    }
    lattice->step_begin.push_back(static_cast<int64_t>(lattice->steps.size()));
  }
}

}  // namespace dhelix
