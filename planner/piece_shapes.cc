#include "planner/piece_shapes.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace dhelix {

namespace {

uint64_t bits_of(double x) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

}  // namespace

std::vector<int32_t> op_classes(const BlockCostModel& model, Strand strand) {
  const StrandGraph& graph = model.graph(strand);
  const Strand other = strand == Strand::kForward ? Strand::kBackward : Strand::kForward;
  const StrandGraph& other_graph = model.graph(other);
  // Feature vector: stream, solo time, then both rates against every op of both strands,
  // 0 where that op shares the stream (never read by the simulation, equal across a class
  // since a class shares its stream).
  const auto features = [&](int64_t u) {
    const StrandOp& op = graph.op(u);
    std::vector<uint64_t> f = {static_cast<uint64_t>(op.stream), bits_of(op.solo_time_us)};
    for (const Strand s : {strand, other}) {
      const StrandGraph& g = s == strand ? graph : other_graph;
      for (int64_t w = 0; w < g.size(); ++w) {
        const bool read = g.op(w).stream != op.stream;
        f.push_back(read ? bits_of(model.pair_rate(strand, u, s, w)) : 0);
        f.push_back(read ? bits_of(model.pair_rate(s, w, strand, u)) : 0);
      }
    }
    return f;
  };
  std::map<std::vector<uint64_t>, int32_t> first;
  std::vector<int32_t> classes;
  for (int64_t u = 0; u < graph.size(); ++u) {
    const auto [it, fresh] = first.emplace(features(u), static_cast<int32_t>(u));
    classes.push_back(it->second);
  }
  return classes;
}

PieceShapes::PieceShapes(const BlockCostModel& model, Strand strand)
    : graph_(&model.graph(strand)), class_(op_classes(model, strand)) {}

size_t PieceShapes::KeyHash::operator()(const std::vector<uint64_t>& key) const {
  uint64_t h = 0x632BE59BD9B4E019ULL;
  for (uint64_t word : key) h = (h ^ word) * 0x9E3779B97F4A7C15ULL + (h >> 29);
  return static_cast<size_t>(h);
}

int32_t PieceShapes::find_or_insert(OpMask piece, int32_t fresh) {
  key_.clear();
  int position[kMaxStrandOps];
  int next = 0;
  for (OpMask m = piece; m != 0; m &= m - 1) {  // index order: predecessors come first
    const int i = __builtin_ctzll(m);
    position[i] = next++;
    uint64_t predecessors = 0;
    for (OpMask p = graph_->predecessor_mask(i) & piece; p != 0; p &= p - 1) {
      predecessors |= uint64_t{1} << position[__builtin_ctzll(p)];
    }
    key_.push_back(static_cast<uint64_t>(class_[static_cast<size_t>(i)]));
    key_.push_back(predecessors);
  }
  return ids_.emplace(key_, fresh).first->second;
}

}  // namespace dhelix
