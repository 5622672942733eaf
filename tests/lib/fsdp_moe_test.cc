// Fully sharded data parallelism with a mixture of experts (lib/fsdp_sizes.h,
// lib/dag_builder_fsdp.cc): the non-expert part of a layer shards over the DP group, the
// experts over the expert-data-parallel group (edp = dp·cp·tp / (ep·etp)), each with its
// own gather and reduce-scatter. Every count below is worked by hand in its comment.
//
// Phi-3.5-MoE (h 4096, 32 heads of 128, 8 KV heads, LayerNorm, 16 experts of FFN 6400,
// SwiGLU, bf16) per layer: attention 4096·4096 + 2·4096·1024 + 4096·4096 = 41,943,040;
// two LayerNorms 2·2·4096 = 16,384; router 4096·16 = 65,536; experts 16·3·4096·6400 =
// 1,258,291,200.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "lib/fsdp_sizes.h"
#include "lib/placement.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::make_job;
using testing::phi35_moe;
using Ids = std::set<std::string>;

Ids neighbours(const LayerDag& dag, const std::string& id, bool after) {
  Ids ids;
  const int64_t v = *dag.find(id);
  for (const int64_t i : after ? dag.successors(v) : dag.predecessors(v)) ids.insert(dag.op(i).id);
  return ids;
}

JobSpec moe_zero3(const testing::Shape& shape, bool reshard = true) {
  JobSpec job = make_job(phi35_moe(), shape);
  job.parallel.use_megatron_fsdp = true;
  job.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  job.parallel.fsdp_reshard_after_forward = reshard;
  return job;
}

const Op& op_of(const LayerDag& dag, const std::string& id) {
  const auto index = dag.find(id);
  EXPECT_TRUE(index.has_value()) << id;
  return dag.op(index.value_or(0));
}

TEST(FsdpMoe, SizesSplitTheLayerIntoTheNonExpertPartAndTheExperts) {
  // dp 8, ep 4, tp 1: edp = 8·1·1 / (4·1) = 2.
  const JobSpec job = moe_zero3({.dp = 8, .ep = 4});
  const ParallelSpec& p = job.parallel;
  // Non-expert: 41,943,040 + 16,384 + 65,536 = 42,024,960, all on the rank (tp 1).
  EXPECT_EQ(fsdp_layer_parameters(job.model, p), 42'024'960);
  EXPECT_EQ(fsdp_gather_bytes(job.model, p), 84'049'920);
  EXPECT_EQ(fsdp_reduce_scatter_bytes(job.model, p), 168'099'840);
  // Experts: 1,258,291,200 / ep 4 = 314,572,800.
  EXPECT_EQ(fsdp_expert_data_parallel_size(p), 2);
  EXPECT_TRUE(fsdp_shards_experts(job.model, p));
  EXPECT_EQ(fsdp_expert_parameters(job.model, p), 314'572'800);
  EXPECT_EQ(fsdp_expert_gather_bytes(job.model, p), 629'145'600);
  EXPECT_EQ(fsdp_expert_reduce_scatter_bytes(job.model, p), 1'258'291'200);
  // tp 2 with SP, etp = tp: the attention splits, norms and router do not: 20,971,520 +
  // 16,384 + 65,536 = 21,053,440; experts / (ep 4 · etp 2) = 157,286,400; edp = 16 / 8 = 2.
  const JobSpec tp2 = moe_zero3({.tp = 2, .dp = 8, .ep = 4, .sp = true});
  EXPECT_EQ(fsdp_layer_parameters(tp2.model, tp2.parallel), 21'053'440);
  EXPECT_EQ(fsdp_expert_parameters(tp2.model, tp2.parallel), 157'286'400);
  EXPECT_EQ(fsdp_expert_data_parallel_size(tp2.parallel), 2);
  // etp 1: every TP rank holds whole experts, the edp group spans tp: 16 / 4 = 4 members.
  JobSpec etp1 = tp2;
  etp1.parallel.expert_tp = 1;
  EXPECT_EQ(fsdp_expert_parameters(etp1.model, etp1.parallel), 314'572'800);
  EXPECT_EQ(fsdp_expert_data_parallel_size(etp1.parallel), 4);
  // ep = dp (tp 1): edp 1, the experts stay whole; a dense model has no experts.
  const JobSpec whole = moe_zero3({.dp = 8, .ep = 8});
  EXPECT_EQ(fsdp_expert_data_parallel_size(whole.parallel), 1);
  EXPECT_FALSE(fsdp_shards_experts(whole.model, whole.parallel));
  JobSpec dense = make_job(testing::llama3_70b(), {.tp = 8, .dp = 8, .sp = true});
  dense.parallel.use_megatron_fsdp = true;
  dense.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  EXPECT_EQ(fsdp_expert_parameters(dense.model, dense.parallel), 0);
  EXPECT_FALSE(fsdp_shards_experts(dense.model, dense.parallel));
}

TEST(FsdpMoe, ExpertDataParallelGroupHoldsTheRanksWithTheSameExperts) {
  // dp 8, ep 4 on 8-GPU nodes: EP groups {0..3} {4..7}; rank r holds the experts of EP index
  // r mod 4, so its edp group is {r mod 4, r mod 4 + 4}, one node.
  const JobSpec job = moe_zero3({.dp = 8, .ep = 4});
  const Placement placement(job.parallel, 8);
  const ProcessGroup group = fsdp_expert_group(placement, job.parallel, 5);
  EXPECT_EQ(group.ranks, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(group.scope, GroupScope::kLocal);
  // tp 2 (etp 2), dp 8, ep 4: rank = tp + 2·dp; rank 3 is tp 1, dp 1, EP index 1: the same
  // tp and EP index, dp 1 and 5: ranks 3 and 11, two nodes.
  const JobSpec tp2 = moe_zero3({.tp = 2, .dp = 8, .ep = 4, .sp = true});
  const ProcessGroup split = fsdp_expert_group(Placement(tp2.parallel, 8), tp2.parallel, 3);
  EXPECT_EQ(split.ranks, (std::vector<int64_t>{3, 11}));
  EXPECT_EQ(split.nodes_spanned, 2);
  // etp 1: both TP ranks: 2, 3, 10, 11.
  JobSpec etp1 = tp2;
  etp1.parallel.expert_tp = 1;
  EXPECT_EQ(fsdp_expert_group(Placement(etp1.parallel, 8), etp1.parallel, 3).ranks,
            (std::vector<int64_t>{2, 3, 10, 11}));
}

TEST(FsdpMoe, EachPartHasItsGatherAndReduceScatterOverItsGroup) {
  const JobSpec job = moe_zero3({.dp = 8, .ep = 4});
  const LayerDags dags = build_layer_dags(job, 0);
  const LayerDag& f = dags.forward;
  const LayerDag& b = dags.backward;
  EXPECT_EQ(f.op(0).id, "fwd.fsdp_gather");
  EXPECT_EQ(f.op(1).id, "fwd.fsdp_expert_gather");
  const Op& gather = op_of(f, "fwd.fsdp_gather");
  const Op& expert = op_of(f, "fwd.fsdp_expert_gather");
  EXPECT_EQ(gather.group_size, 8);
  EXPECT_EQ(gather.comm_bytes, 84'049'920);
  EXPECT_EQ(expert.kind, OpKind::kAllGather);
  EXPECT_EQ(expert.group, ParallelDim::kDp);
  EXPECT_EQ(expert.group_size, 2);
  EXPECT_EQ(expert.comm_bytes, 629'145'600);
  EXPECT_EQ(neighbours(f, "fwd.fsdp_expert_gather", true),
            (Ids{"fwd.grouped_fc1", "fwd.grouped_fc2"}));
  EXPECT_EQ(neighbours(f, "fwd.fsdp_gather", true),
            (Ids{"fwd.ln_attn", "fwd.gemm_qkv", "fwd.gemm_proj", "fwd.ln_mlp", "fwd.router"}));
  EXPECT_EQ(neighbours(b, "bwd.fsdp_expert_gather", true),
            (Ids{"bwd.grouped_fc1_dgrad", "bwd.grouped_fc2_dgrad"}));
  EXPECT_EQ(neighbours(b, "bwd.fsdp_gather", true),
            (Ids{"bwd.ln_mlp", "bwd.router", "bwd.proj_dgrad", "bwd.qkv_dgrad", "bwd.ln_attn"}));
  EXPECT_EQ(neighbours(b, "bwd.fsdp_expert_reduce_scatter", false),
            (Ids{"bwd.grouped_fc1_wgrad", "bwd.grouped_fc2_wgrad"}));
  EXPECT_EQ(
      neighbours(b, "bwd.fsdp_reduce_scatter", false),
      (Ids{"bwd.ln_mlp", "bwd.router_wgrad", "bwd.proj_wgrad", "bwd.qkv_wgrad", "bwd.ln_attn"}));
  const Op& scatter = op_of(b, "bwd.fsdp_expert_reduce_scatter");
  EXPECT_EQ(scatter.comm_bytes, 1'258'291'200);  // fp32 gradients
  EXPECT_TRUE(scatter.movable_sink);
  EXPECT_TRUE(f.is_acyclic() && b.is_acyclic());
  // Without reshard: no backward gathers, both reduce-scatters.
  const LayerDags kept = build_layer_dags(moe_zero3({.dp = 8, .ep = 4}, false), 0);
  EXPECT_FALSE(kept.backward.find("bwd.fsdp_expert_gather").has_value());
  EXPECT_TRUE(kept.backward.find("bwd.fsdp_expert_reduce_scatter").has_value());
  // edp 1: the experts have no ops; the non-expert part keeps its three.
  const LayerDags whole = build_layer_dags(moe_zero3({.dp = 8, .ep = 8}), 0);
  EXPECT_FALSE(whole.forward.find("fwd.fsdp_expert_gather").has_value());
  EXPECT_TRUE(whole.forward.find("fwd.fsdp_gather").has_value());
  EXPECT_FALSE(whole.backward.find("bwd.fsdp_expert_reduce_scatter").has_value());
}

TEST(FsdpMoe, FullRecomputeReplaysTheExpertsOnTheBackwardsExpertGather) {
  const LayerDags dags = with_recompute(build_layer_dags(moe_zero3({.dp = 8, .ep = 4}), 0),
                                        RecomputeGranularity::kFull);
  const LayerDag& b = dags.backward;
  EXPECT_TRUE(b.is_acyclic());
  EXPECT_EQ(b.op(0).id, "bwd.fsdp_gather");
  EXPECT_EQ(b.op(1).id, "bwd.fsdp_expert_gather");
  EXPECT_FALSE(b.find("bwd.recompute.fsdp_expert_gather").has_value());
  const Ids after = neighbours(b, "bwd.fsdp_expert_gather", true);
  EXPECT_TRUE(after.count("bwd.recompute.grouped_fc1"));
  EXPECT_TRUE(after.count("bwd.recompute.grouped_fc2"));
  EXPECT_TRUE(after.count("bwd.grouped_fc2_dgrad"));
  EXPECT_TRUE(neighbours(b, "bwd.fsdp_gather", true).count("bwd.recompute.router"));
}

}  // namespace
}  // namespace dhelix
