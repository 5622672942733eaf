// Fully sharded data parallelism with a mixture of experts in the planner: the model
// backend's prices of the experts' gather and reduce-scatter over the expert-data-parallel
// group, the memory model's second part (the experts' shards and buffers), and the exact
// pairing search on a window holding the new collectives (equal to the brute force). Every
// figure is worked by hand in its comment; the sizes are tests/lib/fsdp_moe_test.cc's
// (Phi-3.5-MoE: 42,024,960 non-expert parameters a layer, 16 experts of 78,643,200).
#include <gtest/gtest.h>

#include <string>

#include "lib/dag_builder.h"
#include "lib/fsdp_sizes.h"
#include "planner/brute_force_pairing.h"
#include "planner/co_run_model.h"
#include "planner/memory_model.h"
#include "planner/pairing_search.h"
#include "planner/strand_graph.h"
#include "profiler/collective_cost.h"
#include "profiler/interference.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/planner/dag_window.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

JobSpec moe_zero3(const testing::Shape& shape, bool reshard = true) {
  JobSpec job = testing::make_job(testing::phi35_moe(), shape);
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

TEST(FsdpMoeCost, ExpertCollectivesArePricedOverTheExpertDataParallelGroup) {
  const ClusterSpec cluster = test::a100_like_cluster();
  // dp 8, ep 4, tp 1: the edp group {r, r + 4} inside a node, NVLink B = 232,000 bytes/us,
  // alpha 9 us, n = 2: t = 9 + 1/2 · S / 232,000.
  //   fwd.fsdp_expert_gather S = 629,145,600: 9 + 1355.917241 = 1364.917241 us
  //   bwd.fsdp_expert_reduce_scatter S = 1,258,291,200 (fp32): 9 + 2711.834483 us
  const LayerDags local = build_layer_dags(moe_zero3({.dp = 8, .ep = 4}), 0);
  EXPECT_NEAR(collective_time_us(cluster, op_of(local.forward, "fwd.fsdp_expert_gather")),
              9 + 0.5 * 629145600.0 / 232000, 1e-6);
  EXPECT_NEAR(collective_time_us(cluster, op_of(local.backward, "bwd.fsdp_expert_gather")),
              1364.917241, 1e-5);
  EXPECT_NEAR(collective_time_us(cluster, op_of(local.backward, "bwd.fsdp_expert_reduce_scatter")),
              2720.834483, 1e-5);
  // tp 2 (etp 2) with SP, dp 8, ep 4: the edp group {3, 11} has one member a node: 4 NICs x
  // 24 GB/s · 1/8 = 12,000 bytes/us. S = 2 · 157,286,400 = 314,572,800:
  // t = 9 + 1/2 · S / 12,000 = 9 + 13,107.2 = 13,116.2 us.
  const LayerDags cross = build_layer_dags(moe_zero3({.tp = 2, .dp = 8, .ep = 4, .sp = true}), 3);
  const Op& gather = op_of(cross.forward, "fwd.fsdp_expert_gather");
  EXPECT_EQ(gather.scope, GroupScope::kCrossNode);
  EXPECT_NEAR(collective_time_us(cluster, gather), 13116.2, 1e-6);
}

TEST(FsdpMoeMemory, TheExpertsAreASecondPartShardedOverTheirGroup) {
  // 32 layers: L·P = 32 · 42,024,960 = 1,344,798,720 over dp 8 (a shard 168,099,840);
  // L·Pe = 32 · 314,572,800 = 10,066,329,600 over edp 2 (a shard 5,033,164,800).
  const JobSpec job = moe_zero3({.dp = 8, .ep = 4});
  const StageParameters params =
      stage_parameters(job.model, job.parallel, PipelineShape::kOneFOneB, 0);
  EXPECT_EQ(params.fsdp_layers, 1'344'798'720);
  EXPECT_EQ(params.fsdp_experts, 10'066'329'600);
  EXPECT_EQ(params.expert, params.fsdp_experts);  // every expert parameter is a layer's
  const FsdpMemory m = fsdp_memory(job.model, job.parallel, PipelineShape::kOneFOneB, params);
  // Weights saved: 2 · (1,344,798,720 − 168,099,840) + 2 · (10,066,329,600 − 5,033,164,800)
  // = 2,353,397,760 + 10,066,329,600.
  EXPECT_EQ(m.weight_saving_bytes, 12'419'727'360);
  // Gathered buffers, one strand, two layers in flight: 2·2·42,024,960 + 2·2·314,572,800.
  EXPECT_EQ(m.gathered_buffer_bytes, 168'099'840 + 1'258'291'200);
  // fp32 gradients: 4 · 1,176,698,880 + 4 · 5,033,164,800; buffers 4·2·(P + Pe).
  EXPECT_EQ(m.gradient_saving_bytes, 4'706'795'520 + 20'132'659'200);
  EXPECT_EQ(m.gradient_buffer_bytes, 336'199'680 + 2'516'582'400);
  // Without reshard a layer keeps both parts gathered: 2 · (42,024,960 + 314,572,800).
  const JobSpec kept = moe_zero3({.dp = 8, .ep = 4}, false);
  EXPECT_EQ(fsdp_kept_parameter_bytes(kept.model, kept.parallel), 713'195'520);
  // edp 1 (ep = dp): the experts stay whole, only the non-expert part is sharded.
  const JobSpec whole = moe_zero3({.dp = 8, .ep = 8});
  const StageParameters w =
      stage_parameters(whole.model, whole.parallel, PipelineShape::kOneFOneB, 0);
  EXPECT_EQ(w.fsdp_experts, 0);
  EXPECT_EQ(
      fsdp_memory(whole.model, whole.parallel, PipelineShape::kOneFOneB, w).gathered_buffer_bytes,
      168'099'840);
}

TEST(FsdpMoePairing, ExactSearchPairsTheExpertCollectivesWithTheOtherStrandsCompute) {
  // The forward from its gathers to the QKV GEMM against the backward from the QKV dgrad
  // to the experts' reduce-scatter: equal to the brute force. 16k tokens, so that the GEMMs
  // are as long as the collectives (with 1k the window is bound by its one comm stream and
  // nothing can be gained).
  JobSpec job = moe_zero3({.dp = 8, .ep = 4});
  job.parallel.seq_length = 16384;
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  const StrandGraph f =
      testing::dag_window(dags.forward, "fwd.fsdp_gather", "fwd.gemm_qkv", cluster);
  const StrandGraph b = testing::dag_window(dags.backward, "bwd.qkv_dgrad",
                                            "bwd.fsdp_expert_reduce_scatter", cluster);
  ASSERT_GE(f.find("fwd.fsdp_expert_gather"), 0);
  ASSERT_GE(b.find("bwd.fsdp_reduce_scatter"), 0);
  ASSERT_LE(f.size() + b.size(), 12);  // small enough for the brute force
  TableCoRunModel rates(0.9);
  const BlockCostModel model(f, b, rates);
  const PairingResult dp = search_pairing(model, {});
  const BruteForceResult brute = brute_force_pairing(model, 0);
  EXPECT_NEAR(dp.total_time_us, brute.total_time_us, 1e-9 * brute.total_time_us);
  EXPECT_NEAR(resimulate_total_us(model, dp.blocks), dp.total_time_us, 1e-9 * dp.total_time_us);
  EXPECT_LT(dp.total_time_us, dp.sequential_time_us);
}

}  // namespace
}  // namespace dhelix
