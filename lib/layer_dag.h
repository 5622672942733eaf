#pragma once
// A layer's operator DAG for one pass (forward or backward) on one rank, stored as a
// Boost.Graph adjacency list whose vertices carry Op. An edge a -> b means b consumes
// what a produces (or must follow a for another stated reason), within the same layer.
// Vertex indices are insertion order and stable; ids (Op::id) are unique.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "lib/op_catalogue.h"

namespace dhelix {

class LayerDag {
 public:
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Op>;

  /// Adds an op and returns its index. DHELIX_CHECKs that the id is new.
  int64_t add_op(Op op);
  /// Adds the edge from -> to (no duplicates).
  void add_edge(int64_t from, int64_t to);

  int64_t size() const;
  const Op& op(int64_t index) const;
  Op& mutable_op(int64_t index);
  std::optional<int64_t> find(const std::string& id) const;
  std::vector<int64_t> predecessors(int64_t index) const;  ///< ascending
  std::vector<int64_t> successors(int64_t index) const;    ///< ascending
  /// A topological order (smallest ready index first, so it is deterministic).
  /// DHELIX_CHECKs acyclicity.
  std::vector<int64_t> topological_order() const;
  bool is_acyclic() const;
  const Graph& graph() const { return graph_; }

 private:
  Graph graph_;
  std::map<std::string, int64_t> index_by_id_;  ///< Op::id -> vertex index
};

/// One layer's two DAGs on one rank.
struct LayerDags {
  LayerDag forward;
  LayerDag backward;
};

}  // namespace dhelix
