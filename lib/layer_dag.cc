#include "lib/layer_dag.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "lib/error.h"

namespace dhelix {

using Vertex = LayerDag::Graph::vertex_descriptor;

int64_t LayerDag::add_op(Op op) {
  DHELIX_CHECK_MSG(index_by_id_.count(op.id) == 0, "duplicate op id " + op.id);
  const std::string id = op.id;
  const auto vertex = boost::add_vertex(std::move(op), graph_);
  const auto index = static_cast<int64_t>(vertex);
  index_by_id_.emplace(id, index);
  return index;
}

void LayerDag::add_edge(int64_t from, int64_t to) {
  DHELIX_CHECK(from >= 0 && from < size() && to >= 0 && to < size());
  DHELIX_CHECK_MSG(from != to, "self edge on " + op(from).id);
  const auto u = static_cast<Vertex>(from);
  const auto v = static_cast<Vertex>(to);
  if (boost::edge(u, v, graph_).second) return;
  boost::add_edge(u, v, graph_);
}

int64_t LayerDag::size() const { return static_cast<int64_t>(boost::num_vertices(graph_)); }

const Op& LayerDag::op(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < size());
  return graph_[static_cast<Vertex>(index)];
}

Op& LayerDag::mutable_op(int64_t index) {
  DHELIX_CHECK(index >= 0 && index < size());
  return graph_[static_cast<Vertex>(index)];
}

std::optional<int64_t> LayerDag::find(const std::string& id) const {
  const auto it = index_by_id_.find(id);
  if (it == index_by_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<int64_t> LayerDag::predecessors(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < size());
  std::vector<int64_t> result;
  for (auto [it, end] = boost::in_edges(static_cast<Vertex>(index), graph_); it != end; ++it) {
    result.push_back(static_cast<int64_t>(boost::source(*it, graph_)));
  }
  std::sort(result.begin(), result.end());
  return result;
}

std::vector<int64_t> LayerDag::successors(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < size());
  std::vector<int64_t> result;
  for (auto [it, end] = boost::out_edges(static_cast<Vertex>(index), graph_); it != end; ++it) {
    result.push_back(static_cast<int64_t>(boost::target(*it, graph_)));
  }
  std::sort(result.begin(), result.end());
  return result;
}

namespace {

// Kahn's algorithm with a min-heap of ready vertices: among the ops that may run next, the
// one inserted first goes first, so the order is a function of the graph alone. Returns
// fewer than all vertices when there is a cycle.
std::vector<int64_t> kahn_order(const LayerDag& dag) {
  const int64_t n = dag.size();
  std::vector<int64_t> waiting(static_cast<size_t>(n));
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> ready;
  for (int64_t v = 0; v < n; ++v) {
    waiting[static_cast<size_t>(v)] = static_cast<int64_t>(dag.predecessors(v).size());
    if (waiting[static_cast<size_t>(v)] == 0) ready.push(v);
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  while (!ready.empty()) {
    const int64_t v = ready.top();
    ready.pop();
    order.push_back(v);
    for (const int64_t w : dag.successors(v)) {
      if (--waiting[static_cast<size_t>(w)] == 0) ready.push(w);
    }
  }
  return order;
}

}  // namespace

std::vector<int64_t> LayerDag::topological_order() const {
  std::vector<int64_t> order = kahn_order(*this);
  DHELIX_CHECK_MSG(static_cast<int64_t>(order.size()) == size(), "layer DAG has a cycle");
  return order;
}

bool LayerDag::is_acyclic() const {
  return static_cast<int64_t>(kahn_order(*this).size()) == size();
}

}  // namespace dhelix
