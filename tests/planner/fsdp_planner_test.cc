// Fully sharded data parallelism in the planner: the model backend's prices of FSDP's
// collectives, the memory model's sharded and gathered terms, the iteration-end DP
// reduction left to the stage extras, the frameworks' one-layer prefetch in the baselines
// (planner/fsdp_prefetch.h), all against hand arithmetic, and the exact pairing search on a
// DAG holding the new collectives (equal to the brute force).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/fsdp_sizes.h"
#include "lib/job_reader.h"
#include "lib/plan/plan_check.h"
#include "planner/brute_force_pairing.h"
#include "planner/co_run_model.h"
#include "planner/fsdp_prefetch.h"
#include "planner/layer_costs.h"
#include "planner/memory_model.h"
#include "planner/pairing_search.h"
#include "planner/plan_builder.h"
#include "planner/profile_co_run.h"
#include "planner/strand_graph.h"
#include "profiler/collective_cost.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/planner/dag_window.h"
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

TEST(FsdpMemory, FullRecomputeKeepsTheInputAndTheKeptParameters) {
  // tp 8 with SP, s = 8192, b = 1: a layer's input 2 · 8192 · 8192 / 8 = 16,777,216 bytes.
  // Without reshard a layer also keeps its gathered parameters, 2 · P = 213,942,272 bytes,
  // which recompute does not drop: a chunk of 10 layers keeps 10 · (16,777,216 +
  // 213,942,272) = 2,307,194,880 bytes (uniform, one layer a group).
  for (const bool reshard : {true, false}) {
    JobSpec job = llama_zero3(reshard);
    job.parallel.recompute.granularity = RecomputeGranularity::kFull;
    const int64_t kept = reshard ? 0 : 213'942'272;
    EXPECT_EQ(fsdp_kept_parameter_bytes(job.model, job.parallel), kept);
    EXPECT_EQ(layer_input_bytes(job.model, job.parallel), 16'777'216);
    EXPECT_EQ(chunk_activation_bytes(job.model, job.parallel, 10), 10 * (16'777'216 + kept));
    // The transient: one layer's activations less its input and its kept parameters, the
    // same with and without reshard (the replay reads gathered buffers counted elsewhere).
    JobSpec plain = job;
    plain.parallel.use_megatron_fsdp = false;
    EXPECT_EQ(recompute_transient_bytes(job.model, job.parallel, 10),
              recompute_transient_bytes(plain.model, plain.parallel, 10));
    // Block: the first 3 of 10 layers recompute (input + kept), 7 keep everything.
    job.parallel.recompute.method = RecomputeMethod::kBlock;
    job.parallel.recompute.num_layers = 3;
    EXPECT_EQ(chunk_activation_bytes(job.model, job.parallel, 10),
              3 * (16'777'216 + kept) + 7 * layer_activation_bytes(job.model, job.parallel));
  }
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
  // σ = 0.1: h = min(500, 1000 - 300) = 500 us beside the kernels, 50 us lost.
  const PrefetchedStrand slowed =
      prefetched_strand(1000, {.fsdp_us = 500, .same_stream_us = 300, .slowdown = 0.1});
  EXPECT_DOUBLE_EQ(slowed.time_us, 1050);
  EXPECT_DOUBLE_EQ(slowed.exposed_us, 50);
  EXPECT_DOUBLE_EQ(slowed.hidden_us, 450);
}

TEST(FsdpPrefetch, SlowdownWeighsComputeByTimeAndCollectivesByShare) {
  // Compute a (30 us) and b (10 us), gather g (10 us) and reduce-scatter r (30 us), a TP
  // collective t (ignored). Rates: a beside g 0.5, a beside r 0.8, b beside either 1.
  //   σ = 3/4 · (1/4 · (2 − 1) + 3/4 · (1.25 − 1)) + 1/4 · 0 = 3/4 · 0.4375 = 0.328125
  StrandGraph graph;
  graph.add_op("a", StreamClass::kCompute, 30, {});
  graph.add_op("b", StreamClass::kCompute, 10, {});
  graph.add_op("g", StreamClass::kCrossComm, 10, {}, "", true);
  graph.add_op("r", StreamClass::kCrossComm, 30, {}, "", true);
  graph.add_op("t", StreamClass::kLocalComm, 5, {});
  TableCoRunModel rates(1.0);
  rates.set_rate("a", "g", 0.5);
  rates.set_rate("a", "r", 0.8);
  EXPECT_NEAR(fsdp_compute_slowdown(graph, rates), 0.328125, 1e-12);
  EXPECT_DOUBLE_EQ(fsdp_compute_slowdown(graph, TableCoRunModel(1.0)), 0);
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
  // max(T0 + h·σ, S): at least the longer of the two, at most both one after the other.
  EXPECT_GE(a.megatron.forward_us, std::max(plain.megatron.forward_us, gather));
  EXPECT_LE(a.megatron.forward_us, plain.megatron.forward_us + gather);
  EXPECT_GE(a.megatron.backward_us, std::max(plain.megatron.backward_us, gather + scatter));
  EXPECT_LE(a.megatron.backward_us, plain.megatron.backward_us + gather + scatter);
  EXPECT_NEAR(a.megatron.forward_us - plain.megatron.forward_us,
              a.megatron.forward_comm[ParallelDim::kDp].exposed_us -
                  plain.megatron.forward_comm[ParallelDim::kDp].exposed_us,
              1e-6);
  // DHelix's strands alone expose the collectives (nothing in one layer hides them); its
  // pair hides some under the other strand.
  EXPECT_GT(a.dhelix_layer.forward_us, a.megatron.forward_us);
  EXPECT_GT(a.dhelix_layer.si_pair_comm[ParallelDim::kDp].hidden_us, 0);
}

TEST(FsdpPairing, WindowsGatherTheNextLayersParametersWhileThisOneComputes) {
  // Two forward layers concatenated (the chunk scope's window): layer 1's gather follows
  // nothing, its first weight readers follow layer 0's sink (bda_mlp) and their gather.
  const LayerDags dags = build_layer_dags(llama_zero3(), 0);
  const StrandGraph layer = from_layer_dag(dags.forward, [](const Op&) { return 1.0; });
  EXPECT_TRUE(layer.op(layer.find("fwd.fsdp_gather")).fsdp_collective);
  const StrandGraph window = concatenate_layers({layer, layer});
  EXPECT_TRUE(window.op(window.find("L1.fwd.fsdp_gather")).predecessors.empty());
  const std::vector<int64_t>& ln = window.op(window.find("L1.fwd.ln_attn")).predecessors;
  EXPECT_EQ(
      ln, (std::vector<int64_t>{window.find("L0.fwd.bda_mlp"), window.find("L1.fwd.fsdp_gather")}));
  // Backward: layer 1 follows layer 0's sinks as without FSDP (its wgrads and ln_attn, which
  // only the reduce-scatter follows), not the reduce-scatter.
  const StrandGraph back = from_layer_dag(dags.backward, [](const Op&) { return 1.0; });
  const StrandGraph bw = concatenate_layers({back, back});
  EXPECT_TRUE(bw.op(bw.find("L1.bwd.fsdp_gather")).predecessors.empty());
  const std::vector<int64_t>& bda = bw.op(bw.find("L1.bwd.bda_mlp")).predecessors;
  EXPECT_EQ(std::count(bda.begin(), bda.end(), bw.find("L0.bwd.fsdp_reduce_scatter")), 0);
  std::vector<int64_t> expected;
  for (const char* id : {"L0.bwd.fc2_wgrad", "L0.bwd.fc1_wgrad", "L0.bwd.proj_wgrad",
                         "L0.bwd.qkv_wgrad", "L0.bwd.ln_attn"})
    expected.push_back(bw.find(id));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(bda, expected);
  // Without FSDP the chain is as before: layer 1's root follows layer 0's sink.
  JobSpec plain = llama_zero3();
  plain.parallel.use_megatron_fsdp = false;
  const StrandGraph p =
      from_layer_dag(build_layer_dags(plain, 0).forward, [](const Op&) { return 1.0; });
  const StrandGraph pw = concatenate_layers({p, p});
  EXPECT_EQ(pw.op(pw.find("L1.fwd.ln_attn")).predecessors,
            std::vector<int64_t>{pw.find("L0.fwd.bda_mlp")});
}

// ---------------------------------------------------------------- plans that lower

TEST(FsdpPlan, PlansOfTheTinyExampleLowerAndCheckWithEveryShape) {
  // tiny-fsdp-dp4 as shipped (dp 4), on two stages (dp 2, pp 2: pipeline transfers beside
  // the gathers), as the V (split backwards: the reduce-scatter goes with W) and without
  // reshard_after_forward: every rank's program lowers and passes the plan checker.
  const JobSpec shipped =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-fsdp-dp4.json");
  JobSpec pp2 = shipped;
  pp2.parallel.dp = 2;
  pp2.parallel.pp = 2;
  JobSpec keep = shipped;
  keep.parallel.fsdp_reshard_after_forward = false;
  struct Case {
    const JobSpec* job;
    ShapeRequest shape;
  };
  for (const Case& c : {Case{&shipped, ShapeRequest::kAuto}, Case{&pp2, ShapeRequest::kAuto},
                        Case{&pp2, ShapeRequest::kV}, Case{&keep, ShapeRequest::kAuto}}) {
    const Profile profile = make_model_profile(*c.job, OrderedJson::object());
    PlanRequest request;
    request.job = c.job;
    request.profile = &profile;
    request.profile_name = "model";
    request.profile_ref = {.name = "model", .sha256 = "generated:model"};
    request.unprofiled_op_time_us = [c](const Op& op) { return op_time_us(c.job->cluster, op); };
    request.shape = c.shape;
    const Plan plan = build_plan(request).plan;
    ASSERT_TRUE(plan.options.fsdp.has_value());
    EXPECT_EQ(plan.schema_version, "1.4.0");
    const PlanCheckReport report = check_plan(plan, "p.json");
    EXPECT_TRUE(report.ok()) << c.job->parallel.pp << " stages, shape "
                             << static_cast<int>(c.shape);
  }
}

// ---------------------------------------------------------------- exactness

TEST(FsdpPairing, ExactSearchPairsTheGatherAndReduceScatterWithTheOtherStrandsCompute) {
  // Llama-3-70B tp 8 dp 8 with 1k tokens (collectives large beside the GEMMs): the forward
  // from the gather to the projection against the backward from its attention to the
  // reduce-scatter; equal to the brute force.
  JobSpec job = llama_zero3();
  job.parallel.seq_length = 1024;
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  const StrandGraph f =
      testing::dag_window(dags.forward, "fwd.fsdp_gather", "fwd.gemm_qkv", cluster);
  const StrandGraph b =
      testing::dag_window(dags.backward, "bwd.qkv_dgrad", "bwd.fsdp_reduce_scatter", cluster);
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
