// Fully sharded data parallelism in the planner: the model backend's prices of FSDP's
// collectives, the memory model's sharded and gathered terms, the iteration-end DP
// reduction left to the stage extras, the frameworks' one-layer prefetch in the baselines
// (planner/fsdp_prefetch.h), all against hand arithmetic, and the exact pairing search on a
// DAG holding the new collectives (equal to the brute force).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/fsdp_sizes.h"
#include "planner/brute_force_pairing.h"
#include "planner/co_run_model.h"
#include "planner/fsdp_prefetch.h"
#include "planner/layer_costs.h"
#include "planner/memory_model.h"
#include "planner/pairing_search.h"
#include "planner/profile_co_run.h"
#include "profiler/collective_cost.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

// Llama-3-70B, tp 8 with SP, dp 8 (the DP group one rank a node over 8 nodes), ZeRO-3.
JobSpec llama_zero3(bool reshard = true, int64_t pp = 1) {
  JobSpec job = make_job(llama3_70b(), {.tp = 8, .dp = 8, .pp = pp, .sp = true, .seq = 8192});
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

// ---------------------------------------------------------------- prices

TEST(FsdpCost, GatherAndReduceScatterArePricedOverTheDpGroupsRails) {
  // The DP group {0, 8, ..., 56} has one member a node: 4 NICs x 24 GB/s · 1/8 = 12 GB/s
  // (12,000 bytes/us), alpha = 9 us, n = 8.
  //   fwd.fsdp_gather S = 213,942,272: t = 7 · 9 + 7/8 · S / 12,000 = 63 + 15,599.957333
  //   bwd.fsdp_reduce_scatter S = 427,884,544 (fp32): 63 + 31,199.914667
  const LayerDags dags = build_layer_dags(llama_zero3(), 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.fsdp_gather")), 15662.957333,
              1e-5);
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.backward, "bwd.fsdp_gather")), 15662.957333,
              1e-5);
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.backward, "bwd.fsdp_reduce_scatter")),
              31262.914667, 1e-5);
  // dp 8 inside one node (tp 1, 8 GPUs): NVLink, B = 232 GB/s: 1/tp the sizes of tp 8 ...
  JobSpec local = make_job(llama3_70b(), {.tp = 1, .dp = 8, .seq = 8192});
  local.parallel.use_megatron_fsdp = true;
  local.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  const Op& gather = op_of(build_layer_dags(local, 0).forward, "fwd.fsdp_gather");
  // S = 2 · 855,654,400 = 1,711,308,800: t = 63 + 7/8 · S / 232,000 = 63 + 6454.3 us.
  EXPECT_EQ(gather.scope, GroupScope::kLocal);
  EXPECT_NEAR(collective_time_us(cluster, gather), 63 + 0.875 * 1711308800.0 / 232000, 1e-6);
}

// ---------------------------------------------------------------- memory

TEST(FsdpMemory, ShardsTheLayersAndHoldsTheGatheredBuffersInFlight) {
  // 80 layers of P = 106,971,136 parameters on the rank: L·P = 8,557,690,880, a dp-8 shard
  // 1,069,711,360. Extras (pp 1: embedding and untied head, 16,032 · 8192 = 131,334,144
  // each, the final norm 8192): 262,676,480.
  const JobSpec job = llama_zero3();
  const StageParameters params =
      stage_parameters(job.model, job.parallel, PipelineShape::kOneFOneB, 0);
  EXPECT_EQ(params.fsdp_layers, 8'557'690'880);
  EXPECT_EQ(params.dense - params.fsdp_layers, 262'676'480);
  const MemoryOptions options = [] {
    MemoryOptions o;
    o.distributed_optimizer = true;
    return o;
  }();
  const StageMemory one =
      stage_memory(job.model, job.parallel, PipelineShape::kOneFOneB, options, {0}).front();
  // Weights: 2 · (262,676,480 + 1,069,711,360) + 2 buffers (running, prefetched) x one strand
  // x 2 · P = 2,664,775,680 + 427,884,544 = 3,092,660,224 (17,640,734,720 unsharded).
  EXPECT_EQ(one.weight_bytes, 3'092'660'224);
  // Gradients: 4 · 1,332,387,840 + 2 · 4 · P = 5,329,551,360 + 855,769,088.
  EXPECT_EQ(one.gradient_bytes, 6'185'320'448);
  // Optimizer: 12 / 8 of all parameters, as the distributed optimizer.
  EXPECT_EQ(one.optimizer_bytes, 12 * params.total() / 8);
  // The folded W runs two strands: two more buffers of 2 · P.
  const StageMemory w =
      stage_memory(job.model, job.parallel, PipelineShape::kW, options, {0}).front();
  EXPECT_EQ(w.weight_bytes - one.weight_bytes, 427'884'544);
  // Without reshard_after_forward each micro-batch holds a gathered layer, 2 · P bytes, from
  // its forward to its backward: a per-layer activation.
  const JobSpec keep = llama_zero3(false);
  EXPECT_EQ(layer_activation_bytes(keep.model, keep.parallel) -
                layer_activation_bytes(job.model, job.parallel),
            213'942'272);
  // ZeRO-1 and ZeRO-2 keep the distributed optimizer's terms; no_shard unshards the states.
  JobSpec zero1 = job;
  zero1.parallel.fsdp_sharding = FsdpShardingStrategy::kOptim;
  const StageMemory z1 =
      stage_memory(zero1.model, zero1.parallel, PipelineShape::kOneFOneB, options, {0}).front();
  EXPECT_EQ(z1.weight_bytes, 2 * z1.parameters.total());
  EXPECT_EQ(z1.optimizer_bytes, 12 * z1.parameters.total() / 8);
  JobSpec none = job;
  none.parallel.fsdp_sharding = FsdpShardingStrategy::kNoShard;
  const StageMemory z0 =
      stage_memory(none.model, none.parallel, PipelineShape::kOneFOneB, options, {0}).front();
  EXPECT_EQ(z0.optimizer_bytes, 12 * z0.parameters.total());
}

// ---------------------------------------------------------------- the baselines' prefetch

TEST(FsdpPrefetch, TheWorkedExampleOfTheHeader) {
  // Forward: T0 = 1000, C = 300, S = 500: max(1000, 800) = 1000, all hidden.
  const PrefetchedStrand f = prefetched_strand(1000, {.fsdp_us = 500, .same_stream_us = 300});
  EXPECT_DOUBLE_EQ(f.time_us, 1000);
  EXPECT_DOUBLE_EQ(f.hidden_us, 500);
  EXPECT_DOUBLE_EQ(f.exposed_us, 0);
  // Backward: T0 = 2000, C = 600, S = 500 + 1000: max(2000, 2100) = 2100, 100 exposed.
  const PrefetchedStrand b = prefetched_strand(2000, {.fsdp_us = 1500, .same_stream_us = 600});
  EXPECT_DOUBLE_EQ(b.time_us, 2100);
  EXPECT_DOUBLE_EQ(b.hidden_us, 1400);
  EXPECT_DOUBLE_EQ(b.exposed_us, 100);
  LayerCosts plain;
  plain.forward_us = 1000;
  plain.backward_us = 2000;
  plain.si_pair_us = 2500;
  const LayerCosts with = with_fsdp_prefetch(plain, {.fsdp_us = 500, .same_stream_us = 300},
                                             {.fsdp_us = 1500, .same_stream_us = 600});
  EXPECT_DOUBLE_EQ(with.forward_us + with.backward_us, 3100);
  EXPECT_DOUBLE_EQ(with.backward_comm[ParallelDim::kDp].exposed_us, 100);
  EXPECT_DOUBLE_EQ(with.forward_comm[ParallelDim::kDp].hidden_us, 500);
  EXPECT_DOUBLE_EQ(with.si_pair_us, 2500);  // left alone
}

TEST(FsdpPrefetch, CollectivesOfAPassAndTheirStream) {
  // Solo time = comm_bytes / 1e6 for communication, 1 us for compute. tp 8 dp 8: the FSDP
  // collectives cross nodes, TP stays on the node: nothing else on their stream.
  const auto solo = [](const Op& op) {
    return is_communication(op.kind) ? static_cast<double>(op.comm_bytes) / 1e6 : 1.0;
  };
  const LayerDags dags = build_layer_dags(llama_zero3(), 0);
  const FsdpPassCollectives f = fsdp_pass_collectives(dags.forward, solo);
  EXPECT_DOUBLE_EQ(f.fsdp_us, 213.942272);
  EXPECT_DOUBLE_EQ(f.same_stream_us, 0);
  const FsdpPassCollectives b = fsdp_pass_collectives(dags.backward, solo);
  EXPECT_DOUBLE_EQ(b.fsdp_us, 213.942272 + 427.884544);
  // tp 2 dp 4 on one node: TP and DP share the local stream: SP's 4 forward collectives of
  // 8192 tokens x 8192 x 2 bytes = 134,217,728 each.
  JobSpec local = make_job(llama3_70b(), {.tp = 2, .dp = 4, .sp = true, .seq = 8192});
  local.parallel.use_megatron_fsdp = true;
  local.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  const FsdpPassCollectives lf = fsdp_pass_collectives(build_layer_dags(local, 0).forward, solo);
  EXPECT_DOUBLE_EQ(lf.same_stream_us, 4 * 134.217728);
}

TEST(FsdpBaseline, MegatronPrefetchesOneLayerAheadAndDhelixHidesTheRestUnderTheOtherStrand) {
  // Llama-3-70B with 4 layers, tp 8 dp 8, the model backend's profile.
  JobSpec job = llama_zero3();
  job.model.num_layers = 4;
  job.cluster = test::a100_like_cluster();
  const Profile profile = make_model_profile(job, OrderedJson::object());
  const PairTimesCoRunModel co_run = profile_co_run_model(profile);
  const LayerAnalysis a = analyze_layers(job, 0, profile, co_run, 1, 8);
  JobSpec plain_job = job;
  plain_job.parallel.use_megatron_fsdp = false;
  const LayerAnalysis plain = analyze_layers(plain_job, 0, profile, co_run, 1, 8);
  // The baseline: the layer without FSDP, its collectives on the cross-node stream beside it.
  const double gather = profile_solo_time_us(profile, op_of(a.dags.forward, "fwd.fsdp_gather"));
  const double scatter =
      profile_solo_time_us(profile, op_of(a.dags.backward, "bwd.fsdp_reduce_scatter"));
  EXPECT_DOUBLE_EQ(a.megatron.forward_us, std::max(plain.megatron.forward_us, gather));
  EXPECT_DOUBLE_EQ(a.megatron.backward_us, std::max(plain.megatron.backward_us, gather + scatter));
  EXPECT_NEAR(a.megatron.forward_comm[ParallelDim::kDp].hidden_us +
                  a.megatron.forward_comm[ParallelDim::kDp].exposed_us,
              gather, 1e-6);
  // DHelix's strands alone expose the collectives (nothing in one layer hides them); its
  // pair hides some under the other strand.
  EXPECT_GT(a.dhelix_layer.forward_us, a.megatron.forward_us);
  EXPECT_GT(a.dhelix_layer.si_pair_comm[ParallelDim::kDp].hidden_us, 0);
}

// ---------------------------------------------------------------- exactness

// The ops of `dag` between `first` and `last` (inclusive) in its StrandGraph order, with
// the DAG's edges between them: small enough for the brute force.
StrandGraph window(const LayerDag& dag, const std::string& first, const std::string& last,
                   const ClusterSpec& cluster) {
  const StrandGraph whole =
      from_layer_dag(dag, [&cluster](const Op& op) { return op_time_us(cluster, op); });
  const int64_t begin = whole.find(first);
  const int64_t end = whole.find(last);
  StrandGraph out;
  for (int64_t i = begin; i <= end; ++i) {
    const StrandOp& op = whole.op(i);
    std::vector<int64_t> predecessors;
    for (int64_t p : op.predecessors) {
      if (p >= begin) predecessors.push_back(p - begin);
    }
    out.add_op(op.id, op.stream, op.solo_time_us, predecessors, op.cost_key);
  }
  return out;
}

TEST(FsdpPairing, ExactSearchPairsTheGatherAndReduceScatterWithTheOtherStrandsCompute) {
  // Llama-3-70B tp 8 dp 8 with 1k tokens (collectives large beside the GEMMs): the forward
  // from the gather to the projection against the backward from its attention to the
  // reduce-scatter; equal to the brute force.
  JobSpec job = llama_zero3();
  job.parallel.seq_length = 1024;
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  const StrandGraph f = window(dags.forward, "fwd.fsdp_gather", "fwd.gemm_qkv", cluster);
  const StrandGraph b = window(dags.backward, "bwd.qkv_dgrad", "bwd.fsdp_reduce_scatter", cluster);
  ASSERT_GE(f.find("fwd.fsdp_gather"), 0);
  ASSERT_GE(b.find("bwd.fsdp_reduce_scatter"), 0);
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
