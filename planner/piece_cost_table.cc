#include "planner/piece_cost_table.h"

#include <algorithm>
#include <new>
#include <utility>

namespace dhelix {

PieceCostTable::PieceCostTable(const BlockCostModel& model, const Lattice& forward,
                               const Lattice& backward, int64_t max_dense_entries)
    : model_(&model),
      forward_(&forward),
      backward_(&backward),
      num_backward_(static_cast<int64_t>(backward.pieces.size())) {
  sides_[0].resize(forward.pieces.size());
  sides_[1].resize(backward.pieces.size());
  const int64_t entries = static_cast<int64_t>(forward.pieces.size()) * num_backward_;
  if (entries <= max_dense_entries) {
    auto* table = static_cast<double*>(std::calloc(static_cast<size_t>(entries), sizeof(double)));
    if (table == nullptr) throw std::bad_alloc();
    dense_.reset(table);
  } else {
    sparse_.assign(size_t{1} << 16, Entry{});
  }
}

const BlockSide& PieceCostTable::side(int k, int64_t piece) {
  BlockSide& side = sides_[static_cast<size_t>(k)][static_cast<size_t>(piece)];
  if (side.priority == nullptr) {
    const Lattice& lattice = k == 0 ? *forward_ : *backward_;
    const auto width =
        static_cast<size_t>(std::max<int64_t>(model_->graph(lattice.strand).size(), 1));
    auto& pool = priorities_[static_cast<size_t>(k)];
    pool.push_back(std::make_unique<double[]>(width));
    side = model_->prepare_side(lattice.strand, lattice.pieces[static_cast<size_t>(piece)],
                                pool.back().get());
  }
  return side;
}

double PieceCostTable::simulate(int64_t forward_piece, int64_t backward_piece, double give_up_us) {
  ++simulations_;
  bool exact = true;
  const double cost =
      model_->bounded_cost_us(side(0, forward_piece), side(1, backward_piece), give_up_us, &exact);
  return exact ? -cost : cost;
}

double PieceCostTable::sparse_cost_us(uint64_t key, int64_t forward_piece, int64_t backward_piece,
                                      double give_up_us) {
  const size_t mask = sparse_.size() - 1;
  uint64_t h = key * 0x9E3779B97F4A7C15ULL;
  const size_t home = static_cast<size_t>(h ^ (h >> 29)) & mask;
  for (size_t i = home;; i = (i + 1) & mask) {
    Entry& e = sparse_[i];
    if (e.key == key) {
      if (!std::signbit(e.cost_us) && e.cost_us < give_up_us) {
        e.cost_us = simulate(forward_piece, backward_piece, BlockCostModel::kNoGiveUp);
      }
      return std::abs(e.cost_us);
    }
    if (e.key == ~uint64_t{0}) {
      // A full table at its largest size replaces the entry in the key's home slot (the
      // search asks again mostly for blocks it met recently); probe chains stay intact.
      if (stored_ * 2 >= static_cast<int64_t>(sparse_.size()) &&
          sparse_.size() >= kMaxSparseSlots) {
        sparse_[home] = Entry{key, simulate(forward_piece, backward_piece, give_up_us)};
        return std::abs(sparse_[home].cost_us);
      }
      e.key = key;
      e.cost_us = simulate(forward_piece, backward_piece, give_up_us);
      const double cost = std::abs(e.cost_us);
      if (++stored_ * 2 > static_cast<int64_t>(sparse_.size()) &&
          sparse_.size() < kMaxSparseSlots) {
        grow();
      }
      return cost;
    }
  }
}

void PieceCostTable::grow() {
  std::vector<Entry> old = std::move(sparse_);
  sparse_.assign(old.size() * 2, Entry{});
  const size_t mask = sparse_.size() - 1;
  for (const Entry& e : old) {
    if (e.key == ~uint64_t{0}) continue;
    uint64_t h = e.key * 0x9E3779B97F4A7C15ULL;
    size_t i = static_cast<size_t>(h ^ (h >> 29)) & mask;
    while (sparse_[i].key != ~uint64_t{0}) i = (i + 1) & mask;
    sparse_[i] = e;
  }
}

}  // namespace dhelix
