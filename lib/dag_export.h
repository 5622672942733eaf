#pragma once
// Exports of a layer's DAGs for people (Graphviz DOT) and programs (JSON). Both are
// deterministic: ops in index order, edges sorted, fixed key order.

#include <string>

#include "lib/json_reader.h"
#include "lib/layer_dag.h"

namespace dhelix {

/// Graphviz text with one cluster per pass. A node shows its index, id, kind, shape and
/// (for communication) bytes and group; fill colour is the stream (compute blue, local
/// communication orange, cross-node communication red); movable sinks are dashed.
std::string dag_to_dot(const LayerDags& dags, const std::string& title);

/// {"forward": {...}, "backward": {...}}, each {"ops": [...], "edges": [{"from", "to"}],
/// "topological_order": [ids]}; see op_to_json for an op's fields.
OrderedJson dag_to_json(const LayerDags& dags);

/// Every field of an op and its signature, in a fixed key order.
OrderedJson op_to_json(const Op& op);

}  // namespace dhelix
