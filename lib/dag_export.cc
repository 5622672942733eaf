#include "lib/dag_export.h"

#include <fmt/format.h>

namespace dhelix {
namespace {

const char* stream_colour(StreamClass stream) {
  switch (stream) {
    case StreamClass::kCompute:
      return "#cfe2f3";
    case StreamClass::kLocalComm:
      return "#f9cb9c";
    case StreamClass::kCrossComm:
      return "#ea9999";
  }
  return "#ffffff";
}

std::string escape_dot(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// The second line of a node's label: what the op works on.
std::string shape_text(const Op& op) {
  const OpShape& s = op.shape;
  if (is_communication(op.kind)) {
    std::string text = fmt::format("{} {}{} {}", mib(op.comm_bytes), parallel_dim_name(op.group),
                                   op.group_size, group_scope_name(op.scope));
    if (op.scope == GroupScope::kCrossNode) text += fmt::format(" ({} nodes)", op.nodes_spanned);
    return text;
  }
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kHead:
    case OpKind::kRouter:
      return fmt::format("m {} n {} k {}", s.m, s.n, s.k);
    case OpKind::kGroupedGemm:
      return fmt::format("{} x (m {} n {} k {})", s.batch, s.m, s.n, s.k);
    case OpKind::kAttention:
      return fmt::format("b {} heads {}/{} q {} kv {} d {}{}", s.batch, s.heads, s.kv_heads,
                         s.q_len, s.kv_len, s.head_dim, s.causal ? " causal" : "");
    default:
      return fmt::format("{} x {}", s.m, s.n);
  }
}

void write_cluster(std::string& out, const LayerDag& dag, const char* name, char node_prefix) {
  out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}\";\n", name, name);
  for (int64_t i = 0; i < dag.size(); ++i) {
    const Op& op = dag.op(i);
    std::string kind = op_kind_name(op.kind);
    if (op.gemm_role == GemmRole::kDgrad || op.gemm_role == GemmRole::kWgrad) {
      kind += std::string(" ") + gemm_role_name(op.gemm_role);
    }
    if (!op.variant.empty()) kind += " " + op.variant;
    out += fmt::format("    {}{} [label=\"{} {}\\n{}\\n{}\", fillcolor=\"{}\", style=\"{}\"];\n",
                       node_prefix, i, i, escape_dot(op.id), kind, shape_text(op),
                       stream_colour(op.stream),
                       op.movable_sink ? "rounded,filled,dashed" : "rounded,filled");
  }
  for (int64_t i = 0; i < dag.size(); ++i) {
    for (const int64_t j : dag.successors(i)) {
      out += fmt::format("    {}{} -> {}{};\n", node_prefix, i, node_prefix, j);
    }
  }
  out += "  }\n";
}

OrderedJson pass_to_json(const LayerDag& dag) {
  OrderedJson ops = OrderedJson::array();
  OrderedJson edges = OrderedJson::array();
  for (int64_t i = 0; i < dag.size(); ++i) {
    ops.push_back(op_to_json(dag.op(i)));
    for (const int64_t j : dag.successors(i)) {
      OrderedJson edge;
      edge["from"] = dag.op(i).id;
      edge["to"] = dag.op(j).id;
      edges.push_back(std::move(edge));
    }
  }
  OrderedJson order = OrderedJson::array();
  for (const int64_t i : dag.topological_order()) order.push_back(dag.op(i).id);
  OrderedJson result;
  result["ops"] = std::move(ops);
  result["edges"] = std::move(edges);
  result["topological_order"] = std::move(order);
  return result;
}

}  // namespace

std::string dag_to_dot(const LayerDags& dags, const std::string& title) {
  std::string out = fmt::format("digraph \"{}\" {{\n", escape_dot(title));
  out += fmt::format("  label=\"{}\";\n  labelloc=t;\n", escape_dot(title));
  out += "  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  write_cluster(out, dags.forward, "forward", 'f');
  write_cluster(out, dags.backward, "backward", 'b');
  out += "}\n";
  return out;
}

OrderedJson dag_to_json(const LayerDags& dags) {
  OrderedJson result;
  result["forward"] = pass_to_json(dags.forward);
  result["backward"] = pass_to_json(dags.backward);
  return result;
}

OrderedJson op_to_json(const Op& op) {
  const OpShape& s = op.shape;
  OrderedJson shape;
  shape["m"] = s.m;
  shape["n"] = s.n;
  shape["k"] = s.k;
  shape["batch"] = s.batch;
  shape["heads"] = s.heads;
  shape["kv_heads"] = s.kv_heads;
  shape["q_len"] = s.q_len;
  shape["kv_len"] = s.kv_len;
  shape["head_dim"] = s.head_dim;
  shape["causal"] = s.causal;
  if (s.window > 0) shape["window"] = s.window;
  OrderedJson j;
  j["id"] = op.id;
  j["kind"] = op_kind_name(op.kind);
  j["pass"] = pass_name(op.pass);
  j["gemm_role"] = gemm_role_name(op.gemm_role);
  j["variant"] = op.variant;
  j["dtype"] = dtype_name(op.dtype);
  j["shape"] = std::move(shape);
  j["flops"] = op.flops;
  j["bytes_read"] = op.bytes_read;
  j["bytes_written"] = op.bytes_written;
  j["comm_bytes"] = op.comm_bytes;
  j["group"] = parallel_dim_name(op.group);
  j["group_size"] = op.group_size;
  j["scope"] = group_scope_name(op.scope);
  j["nodes_spanned"] = op.nodes_spanned;
  j["stream"] = stream_class_name(op.stream);
  j["movable_sink"] = op.movable_sink;
  j["signature"] = op.signature();
  return j;
}

}  // namespace dhelix
