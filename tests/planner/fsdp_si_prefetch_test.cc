// dhelix's FSDP prefetch across SI blocks (planner/fsdp_si_prefetch.h): the worked table of
// its file comment against hand arithmetic, the pair's slowdown, and the layer analysis
// that searches the layer without FSDP's collectives and prices them beside its blocks.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "lib/dag_builder.h"
#include "lib/job_reader.h"
#include "lib/plan/plan_blocks.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/rank_program.h"
#include "planner/co_run_model.h"
#include "planner/fsdp_si_prefetch.h"
#include "planner/layer_costs.h"
#include "planner/plan_builder.h"
#include "planner/profile_co_run.h"
#include "planner/strand_graph.h"
#include "profiler/collective_cost.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

// The worked table's layer: P0 = 2400 us paired (T0_f = 1000, T0_b = 2000 alone).
constexpr double kPaired = 2400;

PrefetchedStrand block(const FsdpPassCollectives& f, const FsdpPassCollectives& b, double sigma,
                       int64_t pairs = 1, double paired = kPaired) {
  return prefetched_si_block(paired, si_block_collectives(f, b, sigma, pairs));
}

TEST(FsdpSiPrefetch, ComputeBoundBlockHidesEveryCollective) {
  // max(2400, 500 + 500 + 1000) = 2400; the baseline 1000 + 2000 = 3000.
  const PrefetchedStrand t = block({.fsdp_us = 500}, {.fsdp_us = 1500}, 0);
  EXPECT_DOUBLE_EQ(t.time_us, 2400);
  EXPECT_DOUBLE_EQ(t.hidden_us, 2000);
  EXPECT_DOUBLE_EQ(t.exposed_us, 0);
  const double baseline = prefetched_strand(1000, {.fsdp_us = 500}).time_us +
                          prefetched_strand(2000, {.fsdp_us = 1500}).time_us;
  EXPECT_DOUBLE_EQ(baseline, 3000);
}

TEST(FsdpSiPrefetch, DpBoundBlockLastsItsCollectivesAsTheBaselineDoes) {
  // max(2400, 1000 + 1000 + 2000) = 4000 = the baseline's 1000 + 3000.
  const PrefetchedStrand t = block({.fsdp_us = 1000}, {.fsdp_us = 3000}, 0);
  EXPECT_DOUBLE_EQ(t.time_us, 4000);
  EXPECT_DOUBLE_EQ(t.exposed_us, 1600);
  EXPECT_DOUBLE_EQ(t.hidden_us, 2400);
  const double baseline = prefetched_strand(1000, {.fsdp_us = 1000}).time_us +
                          prefetched_strand(2000, {.fsdp_us = 3000}).time_us;
  EXPECT_DOUBLE_EQ(baseline, 4000);
}

TEST(FsdpSiPrefetch, OtherOpsOnTheDpStreamQueueWithTheCollectives) {
  // C = 300 + 600: max(2400, 900 + 2000) = 2900; the baseline 1000 + max(2000, 2100) = 3100.
  const PrefetchedStrand t =
      block({.fsdp_us = 500, .same_stream_us = 300}, {.fsdp_us = 1500, .same_stream_us = 600}, 0);
  EXPECT_DOUBLE_EQ(t.time_us, 2900);
  EXPECT_DOUBLE_EQ(t.exposed_us, 500);
  EXPECT_DOUBLE_EQ(t.hidden_us, 1500);
}

TEST(FsdpSiPrefetch, SlowedKernelsPayForWhatRunsBesideThem) {
  // σ = 0.1: h = min(2000, 2400) = 2000, the kernels lose 200: max(2600, 2000) = 2600; the
  // baseline 1050 + 2150 = 3200 (h = 500 and 1500).
  const PrefetchedStrand t = block({.fsdp_us = 500}, {.fsdp_us = 1500}, 0.1);
  EXPECT_DOUBLE_EQ(t.time_us, 2600);
  EXPECT_DOUBLE_EQ(t.exposed_us, 200);
  EXPECT_DOUBLE_EQ(t.hidden_us, 1800);
  const double baseline = prefetched_strand(1000, {.fsdp_us = 500, .slowdown = 0.1}).time_us +
                          prefetched_strand(2000, {.fsdp_us = 1500, .slowdown = 0.1}).time_us;
  EXPECT_DOUBLE_EQ(baseline, 3200);
}

TEST(FsdpSiPrefetch, AChunkCarriesEachLayerPairsCollectives) {
  // 4 layer pairs, P0 = 9000 us (the cross-layer scope's chunk): S = 4 · 2000, C = 4 · 900:
  // max(9000, 3600 + 8000) = 11600, = 4 · max(2250, 2900).
  const FsdpPassCollectives c = si_block_collectives(
      {.fsdp_us = 500, .same_stream_us = 300}, {.fsdp_us = 1500, .same_stream_us = 600}, 0.1, 4);
  EXPECT_DOUBLE_EQ(c.fsdp_us, 8000);
  EXPECT_DOUBLE_EQ(c.same_stream_us, 3600);
  EXPECT_DOUBLE_EQ(c.slowdown, 0.1);
  EXPECT_DOUBLE_EQ(prefetched_si_block(9000, c).time_us, 11600);
}

TEST(FsdpSiPrefetch, PairSlowdownWeighsBothStrandsComputeAndCollectives) {
  // Forward: compute a (30 us), gather g (10 us); backward: compute b (10 us),
  // reduce-scatter r (30 us), a TP collective t (ignored). Rates: a beside g 0.5, a beside
  // r 0.8, b beside r 0.5, b beside g 1. Compute 40 us, FSDP 40 us:
  //   σ = 30/40 · (10/40 · (2 − 1) + 30/40 · (1.25 − 1)) + 10/40 · (30/40 · (2 − 1))
  //     = 0.75 · 0.4375 + 0.25 · 0.75 = 0.515625
  StrandGraph forward;
  forward.add_op("a", StreamClass::kCompute, 30, {});
  forward.add_op("g", StreamClass::kCrossComm, 10, {}, "", true);
  StrandGraph backward;
  backward.add_op("b", StreamClass::kCompute, 10, {});
  backward.add_op("r", StreamClass::kCrossComm, 30, {}, "", true);
  backward.add_op("t", StreamClass::kLocalComm, 5, {});
  TableCoRunModel rates(1.0);
  rates.set_rate("a", "g", 0.5);
  rates.set_rate("a", "r", 0.8);
  rates.set_rate("b", "r", 0.5);
  EXPECT_NEAR(fsdp_pair_slowdown(forward, backward, rates), 0.515625, 1e-12);
  EXPECT_DOUBLE_EQ(fsdp_pair_slowdown(forward, backward, TableCoRunModel(1.0)), 0);
  StrandGraph plain;
  plain.add_op("a", StreamClass::kCompute, 30, {});
  EXPECT_DOUBLE_EQ(fsdp_pair_slowdown(plain, plain, rates), 0);
}

JobSpec llama_zero3_4_layers() {
  JobSpec job = make_job(llama3_70b(), {.tp = 8, .dp = 8, .sp = true, .seq = 8192});
  job.parallel.use_megatron_fsdp = true;
  job.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  job.model.num_layers = 4;
  job.cluster = test::a100_like_cluster();
  return job;
}

TEST(FsdpSiPrefetch, DhelixPairsTheLayerWithoutFsdpAndPricesItsCollectivesBesideTheBlocks) {
  const JobSpec job = llama_zero3_4_layers();
  const Profile profile = make_model_profile(job, OrderedJson::object());
  const PairTimesCoRunModel co_run = profile_co_run_model(profile);
  const LayerAnalysis a = analyze_layers(job, 0, profile, co_run, 2, 8);
  JobSpec plain_job = job;
  plain_job.parallel.use_megatron_fsdp = false;
  const LayerAnalysis plain = analyze_layers(plain_job, 0, profile, co_run, 2, 8);
  ASSERT_TRUE(a.fsdp_prefetch);
  EXPECT_FALSE(plain.fsdp_prefetch);
  // The search paired the plain layer: the same SI pair as without FSDP, no FSDP op in it.
  EXPECT_DOUBLE_EQ(a.dhelix.per_layer.total_time_us, plain.dhelix.per_layer.total_time_us);
  EXPECT_LT(a.paired_forward.find("fwd.fsdp_gather"), 0);
  EXPECT_GE(a.forward.find("fwd.fsdp_gather"), 0);
  const PlanPairing record = pairing_record(a);
  EXPECT_TRUE(std::none_of(record.forward_ops.begin(), record.forward_ops.end(),
                           [](const PlanOp& op) { return op.id == "fwd.fsdp_gather"; }));
  // Its SI pair: T = max(P0 + h·σ, C + S) with the profile's collectives.
  const auto solo = [&profile](const Op& op) { return profile_solo_time_us(profile, op); };
  FsdpPassCollectives f = fsdp_pass_collectives(a.dags.forward, solo);
  FsdpPassCollectives b = fsdp_pass_collectives(a.dags.backward, solo);
  const double sigma = fsdp_pair_slowdown(a.forward, a.backward, co_run);
  const double s = f.fsdp_us + b.fsdp_us;
  ASSERT_GT(s, 0);
  const double p0 = plain.dhelix_layer.si_pair_us;
  const double expected = std::max(p0 + std::min(s, p0) * sigma, s);  // C = 0: DP crosses nodes
  EXPECT_NEAR(a.dhelix_layer.si_pair_us, expected, 1e-6 * expected);
  const CommBreakdown& dp_plain = plain.dhelix_layer.si_pair_comm;
  EXPECT_NEAR(a.dhelix_layer.si_pair_comm[ParallelDim::kDp].exposed_us -
                  dp_plain[ParallelDim::kDp].exposed_us,
              a.dhelix_layer.si_pair_us - p0, 1e-6 * expected);
  // The chunk of two layer pairs: the chosen scope's plain time with 2 · S beside it.
  const double chunk_p0 =
      a.chunk_scope ? a.dhelix.cross_layer_chunk_us : a.dhelix.per_layer_chunk_us;
  const double chunk = std::max(chunk_p0 + std::min(2 * s, chunk_p0) * sigma, 2 * s);
  EXPECT_NEAR(a.chunk_si_block_us, chunk, 1e-6 * chunk);
  // Strands alone prefetch one layer ahead as the baseline does.
  EXPECT_NEAR(a.dhelix_layer.forward_us,
              prefetched_strand(
                  plain.dhelix_layer.forward_us,
                  {.fsdp_us = f.fsdp_us, .slowdown = fsdp_compute_slowdown(a.forward, co_run)})
                  .time_us,
              1e-6 * a.dhelix_layer.forward_us);
  (void)b;
}

// ---------------------------------------------------------------- the plan and its lowering

Plan tiny_plan(const JobSpec& job) {
  const Profile profile = make_model_profile(job, OrderedJson::object());
  PlanRequest request;
  request.job = &job;
  request.profile = &profile;
  request.profile_name = "model";
  request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  request.unprofiled_op_time_us = [&job](const Op& op) { return op_time_us(job.cluster, op); };
  return build_plan(request).plan;
}

JobSpec tiny_fsdp(int64_t dp = 4, int64_t pp = 1) {
  JobSpec job = read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-fsdp-dp4.json");
  job.parallel.dp = dp;
  job.parallel.pp = pp;
  return job;
}

bool names(const std::vector<PlanOp>& records, const std::string& id) {
  return std::any_of(records.begin(), records.end(),
                     [&id](const PlanOp& op) { return op.id == id; });
}

TEST(FsdpSiPrefetchLowering, GathersRunOneLayerPairEarlyAndNoBarrierWaitsForThem) {
  for (const auto& [dp, pp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    const JobSpec job = tiny_fsdp(dp, pp);
    const Plan plan = tiny_plan(job);
    ASSERT_FALSE(plan.pairings.empty());
    // The pairing's blocks leave FSDP's collectives out: the lowering issues them.
    EXPECT_FALSE(names(plan.pairings[0].forward_ops, "fwd.fsdp_gather"));
    EXPECT_FALSE(names(plan.pairings[0].backward_ops, "bwd.fsdp_reduce_scatter"));
    EXPECT_TRUE(names(plan.pairings[0].forward_ops, "fwd.gemm_qkv"));
    EXPECT_TRUE(check_plan(plan, "p.json").ok()) << "dp " << dp << " pp " << pp;
    const RankProgram program = lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted);
    int64_t prefetched = 0;
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& g = program.instructions[i];
      if (g.op != "fwd.fsdp_gather" || g.block < 0) continue;
      // In an SI block: prefetched when issued before the previous layer's ops (layer pair
      // j + 1's gather with pair j's first op); its reader waits for it by a data edge.
      bool early = false;
      for (size_t k = i + 1; k < program.instructions.size(); ++k) {
        const Instruction& r = program.instructions[k];
        if (r.micro_batch != g.micro_batch) continue;
        early = early || (r.layer == g.layer - 1 && r.op.starts_with("fwd."));
        if (r.op == "fwd.ln_attn" && r.layer == g.layer) {
          EXPECT_EQ(std::count(r.deps.begin(), r.deps.end(), static_cast<int64_t>(i)), 1);
        }
      }
      if (early) ++prefetched;
      // Only its readers wait for it: no instruction of another block lists it but them.
      for (size_t k = i + 1; k < program.instructions.size(); ++k) {
        const Instruction& r = program.instructions[k];
        if (std::count(r.deps.begin(), r.deps.end(), static_cast<int64_t>(i)) == 0) continue;
        EXPECT_TRUE(r.layer == g.layer && r.micro_batch == g.micro_batch)
            << r.op << " of layer " << r.layer << " waits for the prefetched gather";
      }
    }
    EXPECT_GT(prefetched, 0) << "dp " << dp << " pp " << pp;
  }
}

// The instruction that gathers `op` of (micro_batch, layer); nullptr: none.
const Instruction* gather_of(const RankProgram& program, const std::string& op, int64_t micro_batch,
                             int64_t layer) {
  for (const Instruction& i : program.instructions) {
    if (i.op == op && i.micro_batch == micro_batch && i.layer == layer) return &i;
  }
  return nullptr;
}

// Its task; -1: none.
int64_t gather_task(const RankProgram& program, const std::string& op, int64_t micro_batch,
                    int64_t layer) {
  const Instruction* i = gather_of(program, op, micro_batch, layer);
  return i == nullptr ? -1 : i->task;
}

// The first layer pair of an SI task is priced as prefetched like every other
// (planner/fsdp_si_prefetch.h): when the stage's previous layer task is an SI task too, its
// gathers (both strands') are issued in that task, each with its strand's last layer (the
// memory side: FsdpInterpreter.GatheredWeightsLiveAtOnceAreWhatThePlanCounts); after
// a forward task alone they are the task's own. tiny-fsdp-dp4 (pp 1): forward, forward,
// head-loss, SI 3, SI 4, head-loss, backward, backward; so SI 4's first gathers run in
// task 3.
TEST(FsdpSiPrefetchLowering, AnSiTasksFirstGathersRunDuringThePreviousSiTask) {
  for (const auto& [dp, pp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    SCOPED_TRACE(fmt::format("dp {} pp {}", dp, pp));
    const JobSpec job = tiny_fsdp(dp, pp);
    const Plan plan = tiny_plan(job);
    ASSERT_TRUE(check_plan(plan, "p.json").ok());
    ASSERT_TRUE(plan.options.fsdp.has_value() && plan.options.fsdp->reshard_after_forward);
    const RankProgram program = lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted);
    const PlanStage& stage = plan.stages[0];
    int64_t carried = 0;
    const PlanTask* previous = nullptr;  // the last forward, backward or SI task
    for (const PlanTask& task : stage.tasks) {
      if (task.kind == TaskKind::kHeadLoss) continue;
      if (task.kind == TaskKind::kSiBlock) {
        const int64_t forward_layer = strand_layer(*task.forward, false, 0);
        const int64_t backward_layer = strand_layer(*task.backward, true, 0);
        const bool after_si = previous != nullptr && previous->kind == TaskKind::kSiBlock;
        const int64_t expected = after_si ? previous->index : task.index;
        EXPECT_EQ(gather_task(program, "fwd.fsdp_gather", task.forward->micro_batch, forward_layer),
                  expected)
            << "task " << task.index;
        EXPECT_EQ(
            gather_task(program, "bwd.fsdp_gather", task.backward->micro_batch, backward_layer),
            expected)
            << "task " << task.index;
        // Not carried: both strands' first gathers go with the task's first op, even where
        // one strand starts late in the pairing's blocks.
        if (!after_si) {
          for (const auto& [op, mb, layer] :
               {std::tuple<std::string, int64_t, int64_t>{"fwd.fsdp_gather",
                                                          task.forward->micro_batch, forward_layer},
                {"bwd.fsdp_gather", task.backward->micro_batch, backward_layer}}) {
            const Instruction* gather = gather_of(program, op, mb, layer);
            ASSERT_NE(gather, nullptr) << op;
            EXPECT_EQ(gather->block, 0) << op << " of task " << task.index;
          }
        }
        // A second pair's gathers stay the task's own, issued with its first pair.
        if (std::min(task.forward->layers.count, task.backward->layers.count) > 1) {
          EXPECT_EQ(gather_task(program, "fwd.fsdp_gather", task.forward->micro_batch,
                                strand_layer(*task.forward, false, 1)),
                    task.index);
        }
        carried += after_si ? 1 : 0;
      }
      previous = &task;
    }
    EXPECT_GT(carried, 0);
  }
}

TEST(FsdpSiPrefetchLowering, TheCheckerRejectsAGatherAfterItsReaderAndAnyOtherLeftOutOp) {
  const JobSpec job = tiny_fsdp();
  const Plan good = tiny_plan(job);
  // Tampered: the gather placed in the last layer block, after every forward op reading it.
  Plan late = good;
  PlanPairing& p = late.pairings[0];
  PlanOp gather;
  gather.id = "fwd.fsdp_gather";
  gather.kind = OpKind::kAllGather;
  gather.group = ParallelDim::kDp;
  const LayerDags dags = build_layer_dags(job, 0);
  const Op& op = dags.forward.op(*dags.forward.find("fwd.fsdp_gather"));
  gather.stream = op.stream;
  gather.signature = op.signature();
  p.forward_ops.push_back(gather);
  std::vector<PlanBlock>& blocks =
      p.scope == PairingScope::kChunk ? p.window_blocks : p.layer_blocks;
  ASSERT_FALSE(blocks.empty());
  const bool windowed = p.scope == PairingScope::kChunk;
  PlanBlock& last = blocks.back();
  const double end = last.time_us;
  last.forward_ops.push_back(windowed ? "L0.fwd.fsdp_gather" : "fwd.fsdp_gather");
  last.timings.push_back({.strand = Pass::kForward,
                          .op = windowed ? "L0.fwd.fsdp_gather" : "fwd.fsdp_gather",
                          .start_us = end,
                          .finish_us = end});
  const PlanCheckReport report = check_plan(late, "late.json");
  ASSERT_FALSE(report.ok());
  bool named = false;
  for (const Problem& problem : report.problems.problems()) {
    named = named || problem.rule.find("before its input fwd.fsdp_gather") != std::string::npos;
  }
  EXPECT_TRUE(named);
  // Tampered: a GEMM left out of the records, which no rule issues.
  Plan missing = good;
  std::vector<PlanOp>& ops = missing.pairings[0].forward_ops;
  ops.erase(std::remove_if(ops.begin(), ops.end(),
                           [](const PlanOp& o) { return o.id == "fwd.gemm_fc2"; }),
            ops.end());
  EXPECT_THROW(lower_rank_program(missing, job, 0, ExecutionMode::kCoExecuted), Error);
}

}  // namespace
}  // namespace dhelix
