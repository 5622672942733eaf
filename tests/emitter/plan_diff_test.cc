#include "emitter/plan_diff.h"

#include <string>

#include <gtest/gtest.h>

#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

PlanBlock block(std::vector<std::string> forward, std::vector<std::string> backward,
                double time_us) {
  PlanBlock out;
  out.time_us = time_us;
  out.forward_ops = std::move(forward);
  out.backward_ops = std::move(backward);
  return out;
}

PlanScheme scheme(PipelineScheme name, double iteration_us) {
  PlanScheme out;
  out.scheme = name;
  out.shape = name == PipelineScheme::kMegatron1F1B ? PipelineShape::kOneFOneB : PipelineShape::kW;
  out.iteration_us = iteration_us;
  out.tflops_per_gpu = 100;
  out.mfu = 0.5;
  for (ParallelDim type : kParallelDimNames.values()) out.comm.push_back({type, 0, 0});
  out.comm[0] = {ParallelDim::kTp, 10000, 4100};
  out.memory.push_back({0, 1000, 2000, 3000, 4000, 10000});
  return out;
}

// One stage, one pairing of three layer blocks, the four schemes; dhelix takes 100 ms.
Plan small_plan() {
  Plan plan;
  plan.meta = OrderedJson{{"tool", "dhelix-plan"}, {"version", "0.1.0"}, {"git_hash", "abc"}};
  plan.inputs.model = {"llama-8b", "m1"};
  plan.inputs.parallel = OrderedJson{{"dp", 16}, {"tp", 4}};
  plan.inputs.cluster = {"a40", "c1"};
  plan.inputs.profile = {"model", "generated:model"};
  plan.job.name = "job";
  PlanPairing pairing;
  pairing.scope = PairingScope::kLayer;
  pairing.layer_scope_us = 3000;
  pairing.layer_blocks = {block({"fwd.a"}, {"bwd.x"}, 1000), block({"fwd.b"}, {"bwd.y"}, 1000),
                          block({"fwd.c"}, {"bwd.z"}, 1000)};
  plan.pairings = {pairing};
  PlanStage stage;
  plan.stages = {stage};
  plan.schemes = {
      scheme(PipelineScheme::kDHelix, 100000), scheme(PipelineScheme::kWaveletPlus, 110000),
      scheme(PipelineScheme::kIntraBatch, 120000), scheme(PipelineScheme::kMegatron1F1B, 130000)};
  return plan;
}

PlanScheme& dhelix_of(Plan& plan) { return plan.schemes[0]; }

const NumberChange& figure(const PlanDiff& diff, size_t scheme, const std::string& field) {
  for (const NumberChange& change : diff.schemes[scheme].figures) {
    if (change.field == field) return change;
  }
  ADD_FAILURE() << "no figure " << field;
  static const NumberChange kNone;
  return kNone;
}

TEST(PlanDiff, IdenticalPlansHaveNoDifferences) {
  const Plan plan = small_plan();
  DiffOptions options;
  options.fail_if_slower_pct = 0;
  options.fail_if_changed = true;
  const PlanDiff diff = diff_plans(plan, plan, options);
  EXPECT_TRUE(diff.identical());
  EXPECT_FALSE(diff.plan_changed());
  EXPECT_TRUE(diff.inputs.empty());
  EXPECT_TRUE(diff.failures.empty());
  EXPECT_EQ(diff.summary, std::vector<std::string>{"The plans are identical."});
  ASSERT_EQ(diff.pairing.pairings.size(), 1u);
  ASSERT_EQ(diff.pairing.pairings[0].blocks.size(), 3u);
  for (const BlockDiff& b : diff.pairing.pairings[0].blocks) {
    EXPECT_EQ(b.status, BlockStatus::kSame);
    EXPECT_EQ(b.index_a, b.index_b);
  }
  ASSERT_EQ(diff.schemes.size(), 4u);
  EXPECT_EQ(diff.schemes[3].scheme, PipelineScheme::kMegatron1F1B);
}

std::string golden_plan(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/golden/" + name;
}

TEST(PlanDiff, ExamplePlanAgainstItselfIsIdentical) {
  const Plan plan = read_plan(golden_plan("llama-8b-a40.plan.json"));
  const PlanDiff diff = diff_plans(plan, plan, {});
  EXPECT_TRUE(diff.identical());
  // Every figure of every scheme is compared: 6 + 2 x 5 comm + 2 p2p + 5 per stage memory.
  EXPECT_EQ(diff.schemes[0].figures.size(), 6u + 10u + 2u + 5u * plan.stages.size());
}

TEST(PlanDiff, SameJobOnTwoClustersDiffersInClusterAndFigures) {
  const Plan a40 = read_plan(golden_plan("llama-8b-a40.plan.json"));
  const Plan h100 = read_plan(golden_plan("llama-8b-h100.plan.json"));
  DiffOptions options;
  options.fail_if_slower_pct = 5;
  const PlanDiff diff = diff_plans(a40, h100, options);
  ASSERT_FALSE(diff.inputs.empty());
  EXPECT_EQ(diff.inputs[0].field, "cluster.name");
  EXPECT_EQ(diff.inputs[0].b, "\"h100\"");
  EXPECT_TRUE(diff.plan_changed());
  EXPECT_TRUE(diff.failures.empty());  // faster on H100
  const PlanDiff back = diff_plans(h100, a40, options);
  ASSERT_EQ(back.failures.size(), 1u);
  EXPECT_TRUE(back.failures[0].starts_with("dhelix iteration time grew ")) << back.failures[0];
}

TEST(PlanDiff, ChangedBlockIsReportedWithTheOpsThatMoved) {
  const Plan a = small_plan();
  Plan b = small_plan();
  b.pairings[0].layer_blocks[1].backward_ops = {"bwd.w"};
  const PlanDiff diff = diff_plans(a, b, {});
  const std::vector<BlockDiff>& blocks = diff.pairing.pairings[0].blocks;
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].status, BlockStatus::kSame);
  EXPECT_EQ(blocks[1].status, BlockStatus::kChanged);
  EXPECT_EQ(blocks[1].index_a, 1);
  EXPECT_EQ(blocks[1].index_b, 1);
  EXPECT_EQ(blocks[1].ops_added, std::vector<std::string>{"bwd.w"});
  EXPECT_EQ(blocks[1].ops_removed, std::vector<std::string>{"bwd.y"});
  EXPECT_EQ(blocks[2].status, BlockStatus::kSame);
  EXPECT_TRUE(diff.plan_changed());
  EXPECT_EQ(diff.summary.back(), "The pairing changed in 1 of 3 blocks.");
  EXPECT_NE(plan_diff_to_text(diff).find("layer block 1 -> 1 changed: +bwd.w -bwd.y; 1.0 ms -> "
                                         "1.0 ms\n"),
            std::string::npos)
      << plan_diff_to_text(diff);
}

TEST(PlanDiff, AddedBlockAndBlocksMatchedByContentNotPosition) {
  const Plan a = small_plan();
  Plan b = small_plan();
  std::vector<PlanBlock>& blocks_b = b.pairings[0].layer_blocks;
  std::swap(blocks_b[0], blocks_b[2]);
  blocks_b.push_back(block({"fwd.d"}, {}, 500));
  const PlanDiff diff = diff_plans(a, b, {});
  const std::vector<BlockDiff>& blocks = diff.pairing.pairings[0].blocks;
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0].status, BlockStatus::kSame);
  EXPECT_EQ(blocks[0].index_b, 2);
  EXPECT_EQ(blocks[2].index_b, 0);
  EXPECT_EQ(blocks[3].status, BlockStatus::kAdded);
  EXPECT_EQ(blocks[3].index_a, -1);
  EXPECT_EQ(blocks[3].index_b, 3);
  EXPECT_EQ(blocks[3].ops_added, std::vector<std::string>{"fwd.d"});
  EXPECT_EQ(diff.pairing.pairings[0].structural_changes(), 1);
  EXPECT_EQ(diff.summary.back(), "The pairing changed in 1 of 4 blocks.");
}

TEST(PlanDiff, RemovedAndRetimedBlocks) {
  const Plan a = small_plan();
  Plan b = small_plan();
  b.pairings[0].layer_blocks.pop_back();
  b.pairings[0].layer_blocks[0].time_us = 1200;
  const PlanDiff diff = diff_plans(a, b, {});
  const std::vector<BlockDiff>& blocks = diff.pairing.pairings[0].blocks;
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].status, BlockStatus::kRetimed);
  EXPECT_DOUBLE_EQ(blocks[0].time_b_us, 1200);
  EXPECT_EQ(blocks[2].status, BlockStatus::kRemoved);
  EXPECT_EQ(blocks[2].ops_removed, (std::vector<std::string>{"bwd.z", "fwd.c"}));
  EXPECT_EQ(diff.summary.back(), "The pairing changed in 1 of 3 blocks (1 more retimed).");
}

TEST(PlanDiff, FailIfSlowerTripsAboveTheThresholdOnly) {
  const Plan a = small_plan();
  Plan b = small_plan();
  dhelix_of(b).iteration_us = 105000;  // exactly 5 % slower
  DiffOptions options;
  options.fail_if_slower_pct = 5;
  EXPECT_TRUE(diff_plans(a, b, options).failures.empty());
  options.fail_if_slower_pct = 4.9;
  EXPECT_EQ(
      diff_plans(a, b, options).failures,
      std::vector<std::string>{"dhelix iteration time grew 5.0 % (> 4.9 %): 100.0 ms -> 105.0 ms"});
  // A faster B never trips, not even at 0 %.
  options.fail_if_slower_pct = 0;
  EXPECT_TRUE(diff_plans(b, a, options).failures.empty());
  // Only the dhelix scheme counts.
  Plan c = small_plan();
  c.schemes[1].iteration_us = 200000;
  EXPECT_TRUE(diff_plans(a, c, options).failures.empty());
}

TEST(PlanDiff, RoundingNoiseIsNotAChange) {
  const Plan a = small_plan();
  Plan b = small_plan();
  dhelix_of(b).iteration_us = 100000.00001;  // 1e-10 relative
  dhelix_of(b).mfu = 0.5000000001;
  b.pairings[0].layer_blocks[1].time_us = 1000.0000001;
  DiffOptions options;
  options.fail_if_slower_pct = 0;
  options.fail_if_changed = true;
  const PlanDiff diff = diff_plans(a, b, options);
  EXPECT_TRUE(diff.identical());
  EXPECT_TRUE(diff.failures.empty());
  EXPECT_FALSE(figure(diff, 0, "iteration_us").changed);
  // Just beyond the tolerance is a change.
  dhelix_of(b).iteration_us = 100000.2;
  const PlanDiff beyond = diff_plans(a, b, options);
  EXPECT_TRUE(figure(beyond, 0, "iteration_us").changed);
  EXPECT_EQ(beyond.failures.size(), 2u);
  EXPECT_FALSE(numbers_differ(0, 0, 0));
  EXPECT_TRUE(numbers_differ(0, 1e-12, 1e-6));
}

TEST(PlanDiff, ProvenanceAloneDoesNotTripFailIfChanged) {
  const Plan a = small_plan();
  Plan b = small_plan();
  b.meta["git_hash"] = "def";
  b.inputs.cluster = {"h100", "c2"};
  b.inputs.parallel["tp"] = 8;
  DiffOptions options;
  options.fail_if_changed = true;
  const PlanDiff diff = diff_plans(a, b, options);
  EXPECT_FALSE(diff.identical());
  EXPECT_FALSE(diff.plan_changed());
  EXPECT_TRUE(diff.failures.empty());
  ASSERT_EQ(diff.inputs.size(), 4u);
  EXPECT_EQ(diff.inputs[0].field, "parallel.tp");
  EXPECT_EQ(diff.inputs[0].a, "4");
  EXPECT_EQ(diff.inputs[0].b, "8");
  EXPECT_EQ(diff.inputs[1].field, "cluster.name");
  EXPECT_EQ(diff.inputs[1].a, "\"a40\"");
  EXPECT_EQ(diff.inputs[2].field, "cluster.sha256");
  EXPECT_EQ(diff.inputs[3].field, "tool.git_hash");
  EXPECT_EQ(diff.summary,
            (std::vector<std::string>{
                "The plans were made for different inputs: parallel.tp 4 -> 8, cluster.name "
                "\"a40\" -> \"h100\", cluster.sha256, tool.git_hash.",
                "The pairing and the predicted figures are the same."}));
}

TEST(PlanDiff, SummaryNamesSpeedCommunicationAndMemory) {
  const Plan a = small_plan();
  Plan b = small_plan();
  dhelix_of(b).iteration_us = 87700;
  dhelix_of(b).comm[0].exposed_us = 900;
  dhelix_of(b).comm[3].exposed_us = 100;  // dp: 0 -> 0.1 ms, a smaller move than tp's
  dhelix_of(b).memory[0].total_bytes = 10000 + (int64_t{1} << 30);
  DiffOptions options;
  options.fail_if_changed = true;
  const PlanDiff diff = diff_plans(a, b, options);
  EXPECT_EQ(diff.summary,
            (std::vector<std::string>{
                "dhelix is 1.14x faster on B (12.3 % less time): iteration 100.0 ms -> 87.7 ms.",
                "Exposed TP communication fell from 4.1 ms to 0.9 ms; exposed DP communication "
                "rose from 0.0 us to 100.0 us.",
                "Peak memory per GPU rose from 0.00 GiB to 1.00 GiB.", "The pairing is the same.",
                "Best baseline that fits: megatron-1f1b; dhelix's gain over it 1.30x -> 1.48x."}));
  EXPECT_EQ(diff.failures,
            std::vector<std::string>{"the plans differ: 0 of 3 pairing blocks changed, 0 "
                                     "retimed; 4 predicted figures changed"});
  const NumberChange& iteration = figure(diff, 0, "iteration_us");
  EXPECT_DOUBLE_EQ(iteration.delta(), -12300);
  EXPECT_DOUBLE_EQ(*iteration.relative(), -0.123);
  EXPECT_FALSE(figure(diff, 0, "comm.dp.exposed_us").relative().has_value());
}

TEST(PlanDiff, JsonIsDeterministicAndCarriesEveryFigure) {
  const Plan a = small_plan();
  Plan b = small_plan();
  dhelix_of(b).iteration_us = 87700;
  b.pairings[0].layer_blocks[1].backward_ops = {"bwd.w"};
  const OrderedJson meta{{"tool", "dhelix-diff"}};
  const std::string first = plan_diff_to_json(diff_plans(a, b, {}), meta).dump(2);
  const std::string second = plan_diff_to_json(diff_plans(a, b, {}), meta).dump(2);
  EXPECT_EQ(first, second);
  const OrderedJson json = plan_diff_to_json(diff_plans(a, b, {}), meta);
  EXPECT_EQ(json["schema_version"], "1.0.0");
  EXPECT_EQ(json["plan_changed"], true);
  EXPECT_EQ(json["identical"], false);
  const OrderedJson& iteration = json["schemes"][0]["figures"][0];
  EXPECT_EQ(iteration.dump(),
            R"({"field":"iteration_us","a":100000.0,"b":87700.0,"delta":-12300.0,)"
            R"("relative":-0.123,"changed":true})");
  const OrderedJson& template_json = json["pairing"]["templates"][0];
  EXPECT_EQ(template_json["block_counts"].dump(),
            R"({"same":2,"retimed":0,"changed":1,"added":0,"removed":0})");
  ASSERT_EQ(template_json["blocks"].size(), 1u);  // only blocks that are not the same
  EXPECT_EQ(template_json["blocks"][0]["ops_added"].dump(), R"(["bwd.w"])");
  EXPECT_EQ(json["schemes"][0]["figures"].back().dump(),
            R"({"field":"memory.0.total_bytes","a":10000,"b":10000,"delta":0,)"
            R"("relative":0.0,"changed":false})");
}

TEST(PlanDiff, DurationsAreWrittenInAReadableUnit) {
  EXPECT_EQ(format_duration_us(850), "850.0 us");
  EXPECT_EQ(format_duration_us(4100), "4.1 ms");
  EXPECT_EQ(format_duration_us(98374987), "98.375 s");
}

}  // namespace
}  // namespace dhelix
