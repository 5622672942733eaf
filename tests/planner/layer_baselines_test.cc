// The layer-level baselines (planner/layer_baselines.h): Wavelet+'s round-robin pairing on
// hand-built strands and against the exact search on random ones; the single-strand
// schedule of DAGs of any size; and the three schemes on a Llama-70B TP8 layer.
#include "planner/layer_baselines.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "lib/cluster_presets.h"
#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "profiler/interference.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/planner/cost_model_co_run.h"

namespace dhelix {
namespace {

constexpr StreamClass kC = StreamClass::kCompute;
constexpr StreamClass kL = StreamClass::kLocalComm;

TEST(RoundRobin, WorkedExampleOfTheHeader) {
  // Issue order f0 b0 f1 b1 b2; compute queue f0 b1 b2, comm queue b0 f1. f0 and b0 start
  // at 0; b0 ends at 6 and f1 waits for f0 (10); then f1 10-18 on comm, b1 10-22 and b2
  // 22-26 on compute: 26. Alone: F = 10 + 8 = 18 (a chain), B = 6 + 12 + 4 = 22.
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 8, {0});
  b.add_op("b0", kL, 6, {});
  b.add_op("b1", kC, 12, {0});
  b.add_op("b2", kC, 4, {1});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  const PairingResult r = round_robin_pairing(model);
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].forward_ops, 3u);
  EXPECT_EQ(r.blocks[0].backward_ops, 7u);
  EXPECT_EQ(r.total_time_us, 26);
  EXPECT_EQ(r.blocks[0].time_us, 26);
  EXPECT_EQ(r.forward_alone_us, 18);
  EXPECT_EQ(r.backward_alone_us, 22);
  EXPECT_EQ(r.sequential_time_us, 40);
  EXPECT_EQ(r.stats.block_simulations, 1);
  // Start times of f1 (waits for f0) and b1 (queued behind f0 on compute).
  const auto& ops = r.blocks[0].simulation.ops;
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[3].strand, Strand::kForward);
  EXPECT_EQ(ops[3].op, 1);
  EXPECT_EQ(ops[3].start_us, 10);
  EXPECT_EQ(ops[4].op, 2);
  EXPECT_EQ(ops[4].start_us, 22);
  // The compute stream holds 26 us of work: the search cannot do better either.
  EXPECT_EQ(search_pairing(model).total_time_us, 26);
}

TEST(RoundRobin, HeadOfLineBlockingWhereTheSearchStaggers) {
  // F = f0 (compute 10) -> f1 (comm 10), B = b0 (compute 10) -> b1 (comm 10). Compute queue
  // f0 b0, comm queue f1 b1: f0 0-10, then b0 10-20 beside f1 10-20, then b1 20-30: 30.
  // The search finds the same 30 by staggering (f0, -) (f1, b0) (-, b1).
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 10, {0});
  b.add_op("b0", kC, 10, {});
  b.add_op("b1", kL, 10, {0});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  EXPECT_EQ(round_robin_pairing(model).total_time_us, 30);
  EXPECT_EQ(search_pairing(model).total_time_us, 30);
}

TEST(RoundRobin, AQueuedOpBlocksItsStream) {
  // F = f0 (comm 10) -> f1 (compute 10); B = b0 (compute 2), b1 (compute 10), independent.
  // Issue order f0 b0 f1 b1: compute queue b0 f1 b1, comm queue f0. b0 runs 0-2; then the
  // compute queue's head f1 waits for f0 (until 10) and holds up b1, which is ready: the
  // stream idles 2-10. f1 10-20, b1 20-30: 30. The search starts b1 first (longest path):
  // b1 0-10, f1 10-20, b0 20-22: 22, the compute stream's whole work.
  StrandGraph f, b;
  f.add_op("f0", kL, 10, {});
  f.add_op("f1", kC, 10, {0});
  b.add_op("b0", kC, 2, {});
  b.add_op("b1", kC, 10, {});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  EXPECT_EQ(round_robin_pairing(model).total_time_us, 30);
  EXPECT_EQ(search_pairing(model).total_time_us, 22);
}

TEST(RoundRobin, SlowdownsApplyWhileOpsCoRun) {
  // GEMM 100 beside an all-gather 40 at rates 0.8 / 0.9 (docs/planner.md's worked case):
  // the all-gather ends at 40 / 0.9 = 44.44, the GEMM runs 100 - 0.8·44.44 = 64.44 alone:
  // 108.89 = 100 + 0.2 · 40 / 0.9.
  StrandGraph f, b;
  f.add_op("gemm", kC, 100, {});
  b.add_op("ag", kL, 40, {});
  TableCoRunModel rates;
  rates.set_pair("gemm", "ag", 0.8, 0.9);
  const BlockCostModel model(f, b, rates);
  EXPECT_NEAR(round_robin_pairing(model).total_time_us, 100 + 0.2 * 40 / 0.9, 1e-9);
}

StrandGraph random_graph(std::mt19937_64& rng, const std::string& prefix, int64_t n,
                         double edge_probability) {
  std::uniform_real_distribution<double> unit(0, 1);
  std::uniform_int_distribution<int> time_us(0, 40);
  StrandGraph g;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> preds;
    for (int64_t p = 0; p < i; ++p) {
      if (unit(rng) < edge_probability) preds.push_back(p);
    }
    const double u = unit(rng);
    const StreamClass stream = u < 0.5 ? kC : u < 0.75 ? kL : StreamClass::kCrossComm;
    g.add_op(prefix + std::to_string(i), stream, time_us(rng) == 0 ? 0.0 : 1 + time_us(rng), preds);
  }
  return g;
}

TEST(RoundRobin, ComparedWithTheExactSearchOn300RandomPairs) {
  // Round-robin is not in the search's plan space (fixed FIFO order instead of priority),
  // so neither bounds the other in general; count how often the search wins and loses.
  std::mt19937_64 rng(20240917);
  std::uniform_int_distribution<int> size(0, 9);
  std::uniform_real_distribution<double> unit(0, 1);
  int search_better = 0, round_robin_better = 0;
  for (int c = 0; c < 300; ++c) {
    const int64_t nf = size(rng), nb = size(rng);
    const double density = unit(rng) * 0.7;
    const StrandGraph f = random_graph(rng, "f", nf, density);
    const StrandGraph b = random_graph(rng, "b", nb, density);
    TableCoRunModel rates;
    for (const StrandOp& x : f.ops()) {
      for (const StrandOp& y : b.ops()) {
        if (unit(rng) < 0.5)
          rates.set_pair(x.id, y.id, 0.4 + 0.6 * unit(rng), 0.4 + 0.6 * unit(rng));
      }
    }
    const BlockCostModel model(f, b, rates);
    const PairingResult rr = round_robin_pairing(model);
    PairingOptions unbudgeted;  // 9 independent ops a side weigh 3^18 block pairs
    unbudgeted.max_block_pairs = 0;
    const PairingResult best = search_pairing(model, unbudgeted);
    const double tolerance = 1e-9 * std::max(1.0, rr.total_time_us);
    EXPECT_EQ(rr.sequential_time_us, best.sequential_time_us);
    // One block holding every op, each simulated once.
    ASSERT_EQ(rr.blocks.size(), 1u);
    EXPECT_EQ(rr.blocks[0].forward_ops, f.all_ops());
    EXPECT_EQ(rr.blocks[0].backward_ops, b.all_ops());
    EXPECT_EQ(static_cast<int64_t>(rr.blocks[0].simulation.ops.size()), nf + nb);
    // Something always runs (the lowest-ranked unstarted op is at the head of its queue and
    // ready once its predecessors end), so without slowdowns the block costs at most the
    // sum of all solo times.
    const NoSlowdownModel none;
    const BlockCostModel ideal(f, b, none);
    EXPECT_LE(round_robin_pairing(ideal).total_time_us,
              f.solo_time_sum_us(f.all_ops()) + b.solo_time_sum_us(b.all_ops()) + tolerance);
    search_better += best.total_time_us < rr.total_time_us - tolerance;
    round_robin_better += rr.total_time_us < best.total_time_us - tolerance;
  }
  EXPECT_GT(search_better, 100);  // planning pays on most pairs
  EXPECT_LT(round_robin_better, search_better / 5);
}

// --- single-strand schedules and the Llama-70B TP8 layer on the a40 preset ---

using testing::CostModelCoRun;

JobSpec llama70b_tp8_a40() {
  JobSpec job = testing::make_job(testing::llama3_70b(), {.tp = 8, .sp = true, .seq = 8192});
  job.cluster = find_cluster_preset("a40").value();
  return job;
}

TEST(SingleStrandSchedule, SmallDagIsOnePieceEqualToTheSearch) {
  const JobSpec job = llama70b_tp8_a40();
  const LayerDags dags = build_layer_dags(job, 0);
  CostModelCoRun co_run(job.cluster);
  co_run.add(dags);
  const SingleStrandSchedule s =
      single_strand_schedule(dags.backward, co_run.solo(), co_run, Strand::kBackward);
  ASSERT_EQ(s.pieces.size(), 1u);
  EXPECT_TRUE(s.exact);
  const StrandGraph graph = from_layer_dag(dags.backward, co_run.solo());
  const StrandGraph empty;
  const BlockCostModel model(empty, graph, co_run);
  double expected = 0;
  for (const PairingBlock& b : search_single_strand(model, Strand::kBackward))
    expected += b.time_us;
  EXPECT_DOUBLE_EQ(s.total_time_us, expected);
  EXPECT_EQ(s.blocks[0].front().forward_ops, 0u);
}

TEST(SingleStrandSchedule, ChunkedTp8DagsAreCutAtSeparatorsWhereThereAreAny) {
  const JobSpec job = llama70b_tp8_a40();
  const LayerDags intra = build_intra_batch_layer_dags(job, 0);
  CostModelCoRun co_run(job.cluster);
  co_run.add(intra);
  // Forward (66 ops): the latest separator within 64 ops is fc2's first chunk (everything
  // before precedes it, everything after follows it): exact.
  const SingleStrandSchedule f =
      single_strand_schedule(intra.forward, co_run.solo(), co_run, Strand::kForward);
  ASSERT_EQ(f.pieces.size(), 2u);
  EXPECT_EQ(f.pieces[0].size(), 50);
  EXPECT_EQ(f.pieces[1].op(0).id, "fwd.gemm_fc2.chunk0");
  EXPECT_TRUE(f.exact);
  EXPECT_DOUBLE_EQ(f.total_time_us, f.piece_time_us[0] + f.piece_time_us[1]);
  // Backward (70 ops): the wgrads are sinks, so no separator; the latest cut that only
  // sinks break is reduce_scatter_attn.step6 (position 64): an upper bound.
  const SingleStrandSchedule b =
      single_strand_schedule(intra.backward, co_run.solo(), co_run, Strand::kBackward);
  ASSERT_EQ(b.pieces.size(), 2u);
  EXPECT_EQ(b.pieces[0].size(), 64);
  EXPECT_EQ(b.pieces[1].op(0).id, "bwd.reduce_scatter_attn.step6");
  EXPECT_FALSE(b.exact);
}

TEST(LayerBaselines, Llama70bTp8OnA40IntraBatchBetweenMegatronAndDhelix) {
  const JobSpec job = llama70b_tp8_a40();
  const LayerDags normal = build_layer_dags(job, 0);
  const LayerDags intra = build_intra_batch_layer_dags(job, 0);
  CostModelCoRun co_run(job.cluster);
  co_run.add(normal);
  co_run.add(intra);
  auto alone = [&](const LayerDags& dags) {
    return single_strand_schedule(dags.forward, co_run.solo(), co_run, Strand::kForward)
               .total_time_us +
           single_strand_schedule(dags.backward, co_run.solo(), co_run, Strand::kBackward)
               .total_time_us;
  };
  const double megatron_us = alone(normal);
  const double intra_batch_us = alone(intra);
  const StrandGraph f = from_layer_dag(normal.forward, co_run.solo());
  const StrandGraph b = from_layer_dag(normal.backward, co_run.solo());
  const BlockCostModel model(f, b, co_run);
  const PairingResult dhelix = search_pairing(model);
  const PairingResult wavelet = round_robin_pairing(model);
  EXPECT_DOUBLE_EQ(dhelix.sequential_time_us, megatron_us);
  EXPECT_LT(intra_batch_us, megatron_us);
  EXPECT_GT(intra_batch_us, dhelix.total_time_us);
  EXPECT_LE(dhelix.total_time_us, wavelet.total_time_us);
  EXPECT_LT(wavelet.total_time_us, megatron_us);
  // The figures quoted in docs/planner.md.
  std::printf("megatron %.0f intra-batch %.0f wavelet+ %.0f dhelix %.0f us\n", megatron_us,
              intra_batch_us, wavelet.total_time_us, dhelix.total_time_us);
  RecordProperty("megatron_us", std::to_string(megatron_us));
  RecordProperty("intra_batch_us", std::to_string(intra_batch_us));
  RecordProperty("wavelet_us", std::to_string(wavelet.total_time_us));
  RecordProperty("dhelix_us", std::to_string(dhelix.total_time_us));
}

}  // namespace
}  // namespace dhelix
