#include "emitter/plan_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "emitter/plan_report_rows.h"
#include "lib/error.h"
#include "lib/plan/plan_reader.h"
#include "tests/emitter/picture_fixture.h"

namespace dhelix {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanStageMemory stage_memory(int64_t stage, int64_t weights_mib, int64_t gradients_mib,
                             int64_t optimizer_mib, int64_t activations_mib) {
  const int64_t mib = int64_t{1} << 20;
  return {.stage = stage,
          .weight_bytes = weights_mib * mib,
          .gradient_bytes = gradients_mib * mib,
          .optimizer_bytes = optimizer_mib * mib,
          .activation_bytes = activations_mib * mib,
          .total_bytes = (weights_mib + gradients_mib + optimizer_mib + activations_mib) * mib};
}

// The picture fixture with GPUs, figures, communication and memory filled in:
//   dhelix:        0.470 s, 100.5 TFLOPS, MFU 50 %, bubble 10 %, tp 8.0 / 2.5 ms,
//                  dp 0 / 1.5 ms, stage 0 5 GiB, stage 1 4 GiB
//   megatron-1f1b: 0.520 s, 90.4 TFLOPS, MFU 45 %, bubble 25 %, tp 0 / 10.5 ms, does not fit
Plan report_plan() {
  Plan plan = testing::fixture_plan();
  plan.stages[0].ranks = {0, 1};
  plan.stages[1].ranks = {2, 3};
  plan.memory_budget = {.gpu = "A40",
                        .capacity_bytes = 48 * kGiB,
                        .reserve_bytes = 2 * kGiB,
                        .usable_bytes = 46 * kGiB};
  PlanScheme& dhelix = plan.schemes[0];
  dhelix.iteration_us = 470000;
  dhelix.tflops_per_gpu = 100.5;
  dhelix.mfu = 0.5;
  dhelix.bubble_ratio = 0.1;
  dhelix.comm = {{ParallelDim::kTp, 8000, 2500},
                 {ParallelDim::kCp, 0, 0},
                 {ParallelDim::kEp, 0, 0},
                 {ParallelDim::kDp, 0, 1500},
                 {ParallelDim::kPp, 0, 0}};
  dhelix.memory = {stage_memory(0, 1024, 2048, 512, 1536), stage_memory(1, 1024, 2048, 512, 512)};
  PlanScheme& megatron = plan.schemes[1];
  megatron.iteration_us = 520000;
  megatron.tflops_per_gpu = 90.4;
  megatron.mfu = 0.45;
  megatron.bubble_ratio = 0.25;
  megatron.fits = false;
  megatron.comm = {{ParallelDim::kTp, 0, 10500},
                   {ParallelDim::kCp, 0, 0},
                   {ParallelDim::kEp, 0, 0},
                   {ParallelDim::kDp, 0, 0},
                   {ParallelDim::kPp, 0, 0}};
  megatron.memory = {stage_memory(0, 1024, 2048, 512, 2560), stage_memory(1, 1024, 2048, 512, 0)};
  return plan;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

TEST(PlanReport, ParsesFormatNames) {
  EXPECT_EQ(parse_report_format("text"), ReportFormat::kText);
  EXPECT_EQ(parse_report_format("markdown"), ReportFormat::kMarkdown);
  EXPECT_EQ(parse_report_format("json"), ReportFormat::kJson);
  EXPECT_EQ(parse_report_format("html"), std::nullopt);
  EXPECT_EQ(parse_report_format("JSON"), std::nullopt);
  EXPECT_EQ(parse_report_format(""), std::nullopt);
  EXPECT_STREQ(report_format_name(ReportFormat::kMarkdown), "markdown");
}

TEST(PlanReport, RowsHoldTheFiguresOnceForEveryForm) {
  const report_detail::ReportRows rows = report_detail::report_rows(report_plan());
  EXPECT_EQ(rows.gpus, 4);
  EXPECT_EQ(rows.stages, 2);
  ASSERT_EQ(rows.schemes.size(), 2u);
  EXPECT_EQ(rows.schemes[0].scheme, PipelineScheme::kDHelix);
  EXPECT_DOUBLE_EQ(rows.schemes[0].exposed_comm_us, 4000);  // tp 2500 + dp 1500
  EXPECT_EQ(rows.schemes[1].scheme, PipelineScheme::kMegatron1F1B);
  EXPECT_DOUBLE_EQ(rows.schemes[1].exposed_comm_us, 10500);
  ASSERT_EQ(rows.pairings.size(), 1u);
  EXPECT_EQ(rows.pairings[0].stages, (std::vector<int64_t>{0, 1}));
  ASSERT_TRUE(rows.dhelix_memory.has_value());
  EXPECT_EQ(rows.dhelix_memory->size(), 2u);
  ASSERT_TRUE(rows.si.has_value());
  EXPECT_EQ(rows.si->blocks.size(), 2u);
  // Text and markdown show the same cells.
  EXPECT_EQ(report_detail::scheme_cells(rows.schemes[0]),
            (std::vector<std::string>{"dhelix", "0.470 s", "100.5", "50.0%", "10.0%", "4.0 ms",
                                      "1.11x", "yes"}));
  // Without the dhelix scheme there is no memory breakdown.
  Plan plan = report_plan();
  plan.schemes.erase(plan.schemes.begin());
  EXPECT_FALSE(report_detail::report_rows(plan).dhelix_memory.has_value());
}

TEST(PlanReport, TextIsExact) {
  const std::string expected =
      "fixture: 3 micro-batches, 2 stages, 4 GPUs (A40)\n"
      "scheme                   iteration  TFLOPS/GPU     MFU  bubble  exposed comm  speed-up  "
      "fits\n"
      "dhelix                     0.470 s       100.5   50.0%   10.0%        4.0 ms     1.11x   "
      "yes\n"
      "megatron-1f1b              0.520 s        90.4   45.0%   25.0%       10.5 ms     1.00x    "
      "NO\n"
      "no baseline fits in memory\n"
      "dualpipev-handwritten: DualPipeV needs at least 2·pp = 4 micro-batches, the job has 3\n"
      "communication per GPU and iteration, hidden / exposed:\n"
      "  dhelix                  tp 8.0 ms / 2.5 ms  dp 0.0 ms / 1.5 ms\n"
      "  megatron-1f1b           tp 0.0 ms / 10.5 ms\n"
      "peak memory per GPU by stage:\n"
      "  dhelix                  stage 0 5.00 GiB  stage 1 4.00 GiB\n"
      "  megatron-1f1b           stage 0 6.00 GiB  stage 1 3.50 GiB\n"
      "pairing 0 (stages 0,1): scope layer; SI block of 2 layers: layer scope 0.1 ms, chunk "
      "scope (1-layer windows) 0.1 ms, strands one after the other 0.1 ms\n"
      "dhelix memory per GPU (46.00 GiB usable on A40):\n"
      "  stage 0: 5.00 GiB = weights 1.00 + gradients 2.00 + optimizer 0.50 + activations 1.50\n"
      "  stage 1: 4.00 GiB = weights 1.00 + gradients 2.00 + optimizer 0.50 + activations 0.50\n"
      "SI pairing of one layer (pairing 0, layer scope): forward of micro-batch j beside "
      "backward of micro-batch j - pp\n"
      "block  forward compute  backward compute  communication                         time\n"
      "0      f.a              b.x               f.ag (fwd, tp): hidden            0.022 ms\n"
      "1      f.b              b.y               b.rs (bwd, tp): exposed 0.002 ms  0.016 ms\n"
      "                                          b.kv (bwd, cp): exposed 0.002 ms\n"
      "layer pair 0.038 ms vs strands one after the other 0.048 ms (1.26x); communication "
      "0.012 ms: 0.008 ms hidden, 0.004 ms exposed\n";
  EXPECT_EQ(render_plan_report(report_plan(), ReportFormat::kText), expected);
  EXPECT_EQ(plan_report_text(report_plan()), expected);
}

// The best baseline is the fastest other scheme that fits, not the fastest one.
TEST(PlanReport, SaysWhereTheWorkBudgetBoundedTheSegments) {
  Plan plan = report_plan();
  plan.pairings[0].layer_segment_bound = 6;
  plan.pairings[0].window_segment_bound = 4;
  EXPECT_EQ(report_detail::pairing_sentence(report_detail::report_rows(plan).pairings.at(0)),
            "pairing 0 (stages 0,1): scope layer; SI block of 2 layers: layer scope 0.1 ms, chunk "
            "scope (1-layer windows) 0.1 ms, strands one after the other 0.1 ms; the search's "
            "work budget bounded the layer scope's blocks to 6 ops of each strand; the search's "
            "work budget bounded the windows' blocks to 4 ops of each strand");
}

TEST(PlanReport, NamesTheBestBaselineThatFits) {
  Plan plan = report_plan();
  PlanScheme zb = plan.schemes[1];
  zb.scheme = PipelineScheme::kZeroBubbleV;
  zb.shape = PipelineShape::kV;
  zb.chunks_per_stage = 2;
  zb.iteration_us = 500000;
  zb.fits = true;
  PlanScheme interleaved = plan.schemes[1];
  interleaved.scheme = PipelineScheme::kMegatronInterleaved;
  interleaved.shape = PipelineShape::kInterleaved;
  interleaved.chunks_per_stage = 4;
  interleaved.iteration_us = 480000;  // faster, but does not fit
  plan.schemes.push_back(interleaved);
  plan.schemes.push_back(zb);
  ASSERT_EQ(plan.best_baseline(), &plan.schemes[3]);
  const std::string text = render_plan_report(plan, ReportFormat::kText);
  EXPECT_NE(text.find("megatron-interleaved: virtual pipeline size 4; best baseline that "
                      "fits: zb-v (0.500 s); dhelix 1.06x over it, 1.11x over megatron-1f1b\n"),
            std::string::npos)
      << text;
  const Json j = Json::parse(render_plan_report(plan, ReportFormat::kJson));
  EXPECT_EQ(j.at("best_baseline").at("scheme"), "zb-v");
  EXPECT_NEAR(j.at("best_baseline").at("dhelix_speedup").get<double>(), 500.0 / 470.0, 1e-6);
  EXPECT_NE(render_plan_report(plan, ReportFormat::kMarkdown).find("best baseline that fits: zb-v"),
            std::string::npos);
}

// dhelix's gain is stated over the schemes people run: the generous dualpipev (its pairs
// from the search) is the upper bound on its own line, never the best baseline, and a
// baseline the job rules out is named with its reason.
TEST(PlanReport, TheGenerousDualPipeVIsTheUpperBoundNotTheBestBaseline) {
  Plan plan = report_plan();  // 2 stages, 3 micro-batches
  const auto scheme = [&](PipelineScheme name, PipelineShape shape, int64_t chunks, double us) {
    PlanScheme s = plan.schemes[1];
    s.scheme = name;
    s.shape = shape;
    s.chunks_per_stage = chunks;
    s.iteration_us = us;
    s.fits = true;
    return s;
  };
  plan.schemes.push_back(
      scheme(PipelineScheme::kWaveletPlus, PipelineShape::kW, 2, 400000));  // not run as priced
  plan.schemes.push_back(
      scheme(PipelineScheme::kMegatronInterleaved, PipelineShape::kInterleaved, 1, 500000));
  plan.schemes.push_back(scheme(PipelineScheme::kDualPipeV, PipelineShape::kV, 2, 423000));
  plan.schemes.push_back(
      scheme(PipelineScheme::kDualPipeVHandwritten, PipelineShape::kV, 2, 480000));
  ASSERT_EQ(plan.best_baseline(), &plan.schemes[5]);
  ASSERT_EQ(plan.upper_bound(), &plan.schemes[4]);
  const std::string text = render_plan_report(plan, ReportFormat::kText);
  EXPECT_NE(text.find("best baseline that fits: dualpipev-handwritten (0.480 s); dhelix 1.02x "
                      "over it, 1.11x over megatron-1f1b\n"
                      "upper bound: dualpipev with the search's pairs (0.423 s), dhelix 0.90x "
                      "of it; megatron-a2a-overlap: Megatron-Core runs "
                      "--overlap-moe-expert-parallel-comm with PP > 1 only on interleaved "
                      "stages, and the virtual pipeline size is 1\n"),
            std::string::npos)
      << text;
  const Json j = Json::parse(render_plan_report(plan, ReportFormat::kJson));
  EXPECT_EQ(j.at("schema_version"), "1.2.0");
  EXPECT_EQ(j.at("best_baseline").at("scheme"), "dualpipev-handwritten");
  EXPECT_EQ(j.at("upper_bound").at("scheme"), "dualpipev");
  EXPECT_NEAR(j.at("upper_bound").at("dhelix_speedup").get<double>(), 423.0 / 470.0, 1e-6);
  ASSERT_EQ(j.at("absent_baselines").size(), 1u);
  EXPECT_TRUE(j.at("absent_baselines")[0].get<std::string>().starts_with("megatron-a2a-overlap: "));
  // With interleaved stages Megatron runs the flag: no reason to give.
  plan.schemes[3].chunks_per_stage = 2;
  EXPECT_TRUE(report_detail::report_rows(plan).absent.empty());
}

TEST(PlanReport, MarkdownHasOneTableRowPerSchemeStageAndBlock) {
  const std::vector<std::string> lines =
      lines_of(render_plan_report(report_plan(), ReportFormat::kMarkdown));
  // Tables: comparison (2 schemes), comm by type (2), peak memory (2), dhelix memory
  // (2 stages), SI pairing (2 blocks); each with a header and an alignment row.
  const auto rows = std::count_if(lines.begin(), lines.end(),
                                  [](const std::string& l) { return l.starts_with("|"); });
  EXPECT_EQ(rows, 5 * 2 + 5 * 2);
  EXPECT_EQ(lines.front(), "# fixture: 3 micro-batches, 2 stages, 4 GPUs (A40)");
  const std::vector<std::string> si = {
      "| block | forward compute | backward compute | communication | time |",
      "| ---: | --- | --- | --- | ---: |",
      "| 0 | f.a | b.x | f.ag (fwd, tp): hidden | 0.022 ms |",
      "| 1 | f.b | b.y | b.rs (bwd, tp): exposed 0.002 ms<br>b.kv (bwd, cp): exposed 0.002 ms | "
      "0.016 ms |",
  };
  auto at = std::find(lines.begin(), lines.end(), si[0]);
  ASSERT_NE(at, lines.end());
  ASSERT_GE(lines.end() - at, 6);
  EXPECT_EQ(std::vector<std::string>(at, at + 4), si);
  EXPECT_EQ(*(at + 4), "");
  EXPECT_EQ(*(at + 5),
            "layer pair 0.038 ms vs strands one after the other 0.048 ms (1.26x); communication "
            "0.012 ms: 0.008 ms hidden, 0.004 ms exposed");
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "| megatron-1f1b | 0.520 s | 90.4 | 45.0% | 25.0% | 10.5 ms | 1.00x | NO |"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "| dhelix | 8.0 ms / 2.5 ms | 0.0 ms / 0.0 ms | 0.0 ms / 0.0 ms | "
                      "0.0 ms / 1.5 ms | 0.0 ms / 0.0 ms |"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(), "| megatron-1f1b | 6.00 GiB | 3.50 GiB |"),
            lines.end());
}

TEST(PlanReport, JsonCarriesTheSameFigures) {
  const std::string text = render_plan_report(report_plan(), ReportFormat::kJson);
  ASSERT_TRUE(text.ends_with("}\n"));
  const Json j = Json::parse(text);
  EXPECT_EQ(j.at("schema_version"), kPlanReportSchemaVersion);
  EXPECT_EQ(j.at("job"), "fixture");
  EXPECT_EQ(j.at("num_micro_batches"), 3);
  EXPECT_EQ(j.at("gpus"), 4);
  EXPECT_EQ(j.at("memory_budget").at("usable_bytes"), 46 * kGiB);
  ASSERT_EQ(j.at("schemes").size(), 2u);
  const Json& dhelix = j.at("schemes")[0];
  EXPECT_EQ(dhelix.at("scheme"), "dhelix");
  EXPECT_EQ(dhelix.at("iteration_us"), 470000.0);
  EXPECT_EQ(dhelix.at("speedup_vs_megatron"), 1.106383);
  EXPECT_EQ(dhelix.at("exposed_comm_us"), 4000.0);
  EXPECT_EQ(dhelix.at("comm").at("tp"), Json({{"hidden_us", 8000.0}, {"exposed_us", 2500.0}}));
  EXPECT_EQ(dhelix.at("peak_memory")[1].at("total_bytes"), 4 * kGiB);
  EXPECT_EQ(j.at("schemes")[1].at("fits"), false);
  EXPECT_EQ(j.at("pairings")[0].at("stages"), Json({0, 1}));

  const Json& si = j.at("si_pairing");
  EXPECT_EQ(si.at("layer_pair_us"), 38.0);
  EXPECT_EQ(si.at("sequential_us"), 48.0);
  EXPECT_EQ(si.at("comm_us"), 12.0);
  EXPECT_EQ(si.at("hidden_us"), 8.0);
  EXPECT_EQ(si.at("exposed_us"), 4.0);
  ASSERT_EQ(si.at("blocks").size(), 2u);
  const Json& b1 = si.at("blocks")[1];
  EXPECT_EQ(b1.at("time_us"), 16.0);
  EXPECT_EQ(b1.at("forward_ops"), Json({"f.b"}));
  EXPECT_EQ(b1.at("backward_ops"), Json({"b.y"}));
  ASSERT_EQ(b1.at("comm").size(), 2u);
  EXPECT_EQ(b1.at("comm")[0], Json::parse(R"({"op": "b.rs", "strand": "bwd", "group": "tp",
      "time_us": 5.0, "hidden_us": 3.0, "exposed_us": 2.0, "hidden_under": ["f.b"]})"));
  EXPECT_EQ(si.at("blocks")[0].at("comm")[0].at("exposed_us"), 0.0);
  EXPECT_EQ(si.at("blocks")[0].at("comm")[0].at("hidden_under"), Json({"b.x"}));

  // Deterministic: the same plan gives the same bytes, keys in the written order.
  EXPECT_EQ(render_plan_report(report_plan(), ReportFormat::kJson), text);
  EXPECT_LT(text.find("\"schemes\""), text.find("\"si_pairing\""));
}

TEST(PlanReport, PlanWithoutPairingsHasNoSiTable) {
  Plan plan = report_plan();
  plan.pairings.clear();
  EXPECT_EQ(render_plan_report(plan, ReportFormat::kText).find("SI pairing"), std::string::npos);
  EXPECT_EQ(Json::parse(render_plan_report(plan, ReportFormat::kJson)).at("si_pairing"), nullptr);
}

TEST(PlanReport, UnknownBlockOpIsAnError) {
  Plan plan = report_plan();
  plan.pairings[0].layer_blocks[0].forward_ops.push_back("f.zz");
  try {
    render_plan_report(plan, ReportFormat::kMarkdown);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(e.what(),
                 "plan: pairing 0: a layer block names op 'f.zz', which the pairing lacks");
  }
}

// The shipped example plan: the SI table has one row per layer block and the report stays
// small (only pairing 0's layer scope).
TEST(PlanReport, ExamplePlanStaysSmall) {
  const Plan plan =
      read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/llama-25b-a40-dp8-tp8.json");
  const std::string md = render_plan_report(plan, ReportFormat::kMarkdown);
  const std::vector<std::string> lines = lines_of(md);
  auto at = std::find(lines.begin(), lines.end(),
                      "| block | forward compute | backward compute | communication | time |");
  ASSERT_NE(at, lines.end());
  const auto block_rows =
      std::count_if(at + 2, lines.end(), [](const std::string& l) { return l.starts_with("|"); });
  EXPECT_EQ(block_rows, static_cast<int64_t>(plan.pairings[0].layer_blocks.size()));
  EXPECT_LT(render_plan_report(plan, ReportFormat::kText).size(), 8000u);
  EXPECT_LT(render_plan_report(plan, ReportFormat::kJson).size(), 20000u);
}

}  // namespace
}  // namespace dhelix
