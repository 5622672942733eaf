#include "lib/job_summary.h"

#include <fmt/format.h>

#include "lib/job_reader.h"
#include "lib/placement.h"

namespace dhelix {
namespace {

constexpr ParallelDim kDisplayOrder[] = {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp,
                                         ParallelDim::kDp, ParallelDim::kPp};
constexpr size_t kMaxListedRanks = 16;

// What the groups of one dimension look like.
struct GroupFacts {
  ParallelDim dim = ParallelDim::kTp;
  int64_t size = 1;
  int64_t count = 0;
  int64_t cross_node_count = 0;
  std::vector<int64_t> rank0_members;
};

GroupFacts group_facts(const Placement& placement, ParallelDim dim) {
  GroupFacts facts;
  facts.dim = dim;
  const std::vector<ProcessGroup> groups = placement.all_groups(dim);
  facts.count = static_cast<int64_t>(groups.size());
  for (const ProcessGroup& group : groups) {
    if (group.scope == GroupScope::kCrossNode) ++facts.cross_node_count;
  }
  facts.rank0_members = placement.group(dim, 0).ranks;
  facts.size = static_cast<int64_t>(facts.rank0_members.size());
  return facts;
}

std::string scope_text(const GroupFacts& facts) {
  if (facts.cross_node_count == 0) return group_scope_name(GroupScope::kLocal);
  if (facts.cross_node_count == facts.count) return group_scope_name(GroupScope::kCrossNode);
  return fmt::format("mixed ({} of {} cross-node)", facts.cross_node_count, facts.count);
}

std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size() && i < kMaxListedRanks; ++i) {
    text += (i == 0 ? "" : " ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kMaxListedRanks) text += fmt::format(" ... ({} ranks)", ranks.size());
  return text;
}

std::string billions(int64_t count) { return fmt::format("{:.2f} B", count / 1e9); }

int64_t tokens_per_iteration(const ParallelSpec& p) { return p.global_batch_size * p.seq_length; }

}  // namespace

std::string job_summary_text(const JobSpec& job) {
  const ModelSpec& m = job.model;
  const ClusterSpec& c = job.cluster;
  const ParallelSpec& p = job.parallel;
  std::string out;
  out += fmt::format("job        {} ({})\n", job.name, job.source_file);
  out += fmt::format(
      "model      {}: {} parameters ({} active), {} layers, hidden {}, {} heads "
      "({} KV){}\n",
      m.name, billions(parameter_count(m)), billions(active_parameter_count(m)), m.num_layers,
      m.hidden_size, m.num_attention_heads, m.num_kv_heads,
      m.is_moe() ? fmt::format(", {} experts top-{}", m.moe->num_experts, m.moe->top_k) : "");
  out += fmt::format("           {:.1f} GFLOP per trained token at sequence length {}\n",
                     training_flops_per_token(m, p.seq_length) / 1e9, p.seq_length);
  out += fmt::format("cluster    {}: {} GPUs per node, {} intra-node, {} inter-node\n", c.name,
                     c.gpus_per_node, link_kind_name(c.intra_node.kind),
                     link_kind_name(c.inter_node.kind));
  out +=
      fmt::format("parallel   dp {} · tp {} · cp {} · pp {} · ep {}, sp {}, rank order {}\n", p.dp,
                  p.tp, p.cp, p.pp, p.ep, p.sp ? "on" : "off", rank_order_text(p.rank_order));
  out += fmt::format("world size {} GPUs on {} node{} of {} {}\n", p.world_size(), job.num_nodes(),
                     job.num_nodes() == 1 ? "" : "s", c.gpus_per_node, c.gpu.name);
  out += fmt::format("batch      {} sequences × {} tokens = {} tokens per iteration\n",
                     p.global_batch_size, p.seq_length, tokens_per_iteration(p));
  out += fmt::format("           micro-batch {}, {} micro-batches per pipeline per iteration\n",
                     p.micro_batch_size, p.num_micro_batches());
  const Placement placement(p, c.gpus_per_node);
  out += "groups     dim  size  groups  scope       rank 0's group\n";
  for (ParallelDim dim : kDisplayOrder) {
    const GroupFacts facts = group_facts(placement, dim);
    out += fmt::format("           {:<3}  {:>4}  {:>6}  {:<10}  {}\n", parallel_dim_name(dim),
                       facts.size, facts.count, scope_text(facts), ranks_text(facts.rank0_members));
  }
  return out;
}

OrderedJson job_summary_json(const JobSpec& job) {
  const ModelSpec& m = job.model;
  const ClusterSpec& c = job.cluster;
  const ParallelSpec& p = job.parallel;
  OrderedJson json;
  json["name"] = job.name;
  json["source_file"] = job.source_file;
  json["model"] = {{"name", m.name},
                   {"source_file", m.source_file},
                   {"parameters", parameter_count(m)},
                   {"active_parameters", active_parameter_count(m)},
                   {"num_layers", m.num_layers},
                   {"training_flops_per_token", training_flops_per_token(m, p.seq_length)}};
  json["cluster"] = {{"name", c.name},
                     {"gpu", c.gpu.name},
                     {"gpus_per_node", c.gpus_per_node},
                     {"num_nodes", c.num_nodes}};
  json["parallel"] = parallel_to_json(p);
  json["world_size"] = p.world_size();
  json["num_nodes"] = job.num_nodes();
  json["micro_batches_per_iteration"] = p.num_micro_batches();
  json["tokens_per_iteration"] = tokens_per_iteration(p);
  const Placement placement(p, c.gpus_per_node);
  OrderedJson groups = OrderedJson::array();
  for (ParallelDim dim : kDisplayOrder) {
    const GroupFacts facts = group_facts(placement, dim);
    groups.push_back({{"dim", parallel_dim_name(dim)},
                      {"size", facts.size},
                      {"count", facts.count},
                      {"cross_node_count", facts.cross_node_count},
                      {"scope", scope_text(facts)},
                      {"rank0_group", facts.rank0_members}});
  }
  json["groups"] = groups;
  return json;
}

}  // namespace dhelix
