// dhelix-diff --measured's memory section (emitter/measured_memory.h) on shipped tiny plans
// against synthetic trace records, every figure computed by hand.
//
// llama-tiny: h 64, ffn 128 (SwiGLU), 4 layers, 4 heads of 16, 2 KV heads, vocab 256,
// RMSNorm, untied, fp32. Per layer and GPU at tp 2: attention 64x64 + 2 x 64x32 + 64x64 =
// 12288 and MLP 3 x 64x128 = 24576, split over tp: 18432, plus two norms 128: 18560. The W
// layout puts the embedding (256/2 x 64 = 8192) and the final norm (64) and head (8192) on
// stage 0. tiny-tp2 (pp 1): 4 x 18560 + 8192 + 64 + 8192 = 90688 parameters per rank.
// tiny-tp2-pp2: stage 0 holds layers 0 and 3 with the embedding and head, 2 x 18560 +
// 16448 = 53568; stage 1 layers 1 and 2, 37120.
#include "emitter/measured_memory.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emitter/measured_diff.h"
#include "lib/error.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

constexpr int64_t kTinyTp2Parameters = 90688;

Plan shipped_plan(const std::string& name) {
  return read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json");
}

// A record as dhelix-run --trace writes it (runtime/train/memory_record.h): the CPU's sizes
// unless told otherwise.
Json record(int64_t rank, int64_t stage, int64_t parameters, int64_t arena, int64_t live) {
  return {{"rank", rank},
          {"stage", stage},
          {"weight_bytes", 4 * parameters},
          {"gradient_bytes", 4 * parameters},
          {"optimizer_bytes", 8 * parameters},
          {"activation_arena_bytes", arena},
          {"activation_live_peak_bytes", live},
          {"activation_counted_peak_bytes", live},
          {"activation_element_bytes", 4},
          {"weight_bytes_per_parameter", 4},
          {"gradient_bytes_per_parameter", 4},
          {"optimizer_bytes_per_parameter", 8},
          {"optimizer_shards", 1},
          {"expert_optimizer_bytes", 0},
          {"expert_optimizer_shards", 1},
          {"buffers", arena > 0 ? 7 : 0}};
}

Json trace_with(const std::vector<Json>& records) {
  return {{"otherData", {{"memory", Json(records)}}}};
}

const MemoryTermRow& term(const RankMemoryDiff& rank, const std::string& name) {
  for (const MemoryTermRow& row : rank.terms) {
    if (row.term == name) return row;
  }
  ADD_FAILURE() << "no row " << name;
  return rank.terms.front();
}

TEST(MeasuredMemory, CpuRunOfTinyTp2EqualParametersExplainedBytes) {
  const Plan plan = shipped_plan("tiny-tp2");
  // Rank 1 first: the rows come back in rank order.
  const Json trace = trace_with(
      {record(1, 0, kTinyTp2Parameters, 2129920, 1064960), record(0, 0, kTinyTp2Parameters, 0, 0)});
  const std::optional<MeasuredMemory> memory = compare_memory(plan, trace, "t.json");
  ASSERT_TRUE(memory);
  EXPECT_EQ(memory->scheme, "dhelix");
  EXPECT_TRUE(memory->mismatches.empty());
  ASSERT_EQ(memory->ranks.size(), 2u);
  EXPECT_EQ(memory->ranks[0].rank, 0);
  const RankMemoryDiff& r1 = memory->ranks[1];
  EXPECT_EQ(r1.rank, 1);
  // Weights: the plan's fp32 model, 4 bytes per parameter: 362752 = 4 x 90688 both sides.
  const MemoryTermRow& w = term(r1, "weights");
  EXPECT_EQ(w.predicted_bytes, 362752);
  EXPECT_EQ(w.measured_bytes, 362752);
  EXPECT_EQ(w.predicted_parameters, kTinyTp2Parameters);
  EXPECT_EQ(w.measured_parameters, kTinyTp2Parameters);
  EXPECT_DOUBLE_EQ(*w.error_pct(), 0.0);
  // Optimizer: plan 12 x 90688 = 1088256 (dp 1: one shard), run 8 x 90688 = 725504.
  const MemoryTermRow& o = term(r1, "optimizer states");
  EXPECT_EQ(o.predicted_bytes, 1088256);
  EXPECT_EQ(o.measured_bytes, 725504);
  EXPECT_EQ(o.predicted_bytes_per_parameter, 12);
  EXPECT_EQ(o.measured_bytes_per_parameter, 8);
  EXPECT_EQ(o.measured_parameters, kTinyTp2Parameters);
  EXPECT_TRUE(o.parameters_match());
  EXPECT_NEAR(*o.error_pct(), -100.0 / 3.0, 1e-9);
  // Activations: fp32 plan, fp32 run: no scaling; arena 2 x 1064960 is +100 %.
  EXPECT_EQ(term(r1, "activations (arena)").predicted_bytes, 1064960);
  EXPECT_DOUBLE_EQ(*term(r1, "activations (arena)").error_pct(), 100.0);
  EXPECT_DOUBLE_EQ(*term(r1, "activations (live peak)").error_pct(), 0.0);

  const std::string text = measured_memory_text(memory);
  EXPECT_NE(text.find("optimizer states                       1.038         0.692   -33.3 %"
                      "         90688 = 90688      12 / 8   1 / 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("the run recorded no activation arena"), std::string::npos) << text;
  const OrderedJson json = measured_memory_json(memory);
  EXPECT_EQ(json["ranks"][1]["terms"][2]["error_pct"], -33.33);
  EXPECT_EQ(json["ranks"][1]["terms"][2]["measured_parameters"], kTinyTp2Parameters);
  EXPECT_EQ(json["ranks"][1]["terms"][3]["predicted_parameters"], nullptr);
}

TEST(MeasuredMemory, BackendSizesScaleActivationsAndWeights) {
  const Plan plan = shipped_plan("tiny-tp2");
  // CUDA's sizes: fp32 master + bf16 copy (6 bytes), 2-byte activations.
  Json r = record(0, 0, kTinyTp2Parameters, 600000, 500000);
  r["weight_bytes"] = 6 * kTinyTp2Parameters;
  r["weight_bytes_per_parameter"] = 6;
  r["activation_element_bytes"] = 2;
  const std::optional<MeasuredMemory> memory = compare_memory(plan, trace_with({r}), "t.json");
  ASSERT_TRUE(memory);
  const RankMemoryDiff& rank = memory->ranks[0];
  // 1064960 fp32 bytes predicted, x 2/4 for bf16 activations.
  EXPECT_EQ(term(rank, "activations (arena)").predicted_bytes, 532480);
  EXPECT_EQ(term(rank, "weights").measured_parameters, kTinyTp2Parameters);
  EXPECT_DOUBLE_EQ(*term(rank, "weights").error_pct(), 50.0);
  EXPECT_TRUE(memory->mismatches.empty());
  EXPECT_NE(measured_memory_text(memory).find("activations x 2/4"), std::string::npos);
}

TEST(MeasuredMemory, DistributedOptimizerShardsArePartOfTheComparison) {
  // dp 2 with the distributed optimizer: the plan splits 12 x 90688 over 2 ranks (544128);
  // the CPU run holds every parameter's moments on one shard (725504): +33.3 %, same
  // parameters.
  const Plan plan = shipped_plan("tiny-dp2-tp2");
  const std::optional<MeasuredMemory> memory =
      compare_memory(plan, trace_with({record(0, 0, kTinyTp2Parameters, 0, 0)}), "t.json");
  ASSERT_TRUE(memory);
  const MemoryTermRow& o = term(memory->ranks[0], "optimizer states");
  EXPECT_EQ(o.predicted_bytes, 544128);
  EXPECT_EQ(o.predicted_shards, 2);
  EXPECT_EQ(o.measured_shards, 1);
  EXPECT_TRUE(o.parameters_match());
  EXPECT_NEAR(*o.error_pct(), 100.0 / 3.0, 1e-9);
  // A sharded run: 4 x 90688 bytes on 2 shards hold the same 90688 parameters.
  Json sharded = record(0, 0, kTinyTp2Parameters, 0, 0);
  sharded["optimizer_bytes"] = 4 * kTinyTp2Parameters;
  sharded["optimizer_shards"] = 2;
  EXPECT_TRUE(compare_memory(plan, trace_with({sharded}), "t.json")->mismatches.empty());
}

TEST(MeasuredMemory, ExpertStatesSplitOverTheirOwnShards) {
  // llama-tiny-moe on dp 2 x tp 2 x ep 2 (4 experts of ffn 64, router 64 x 4, expert tp =
  // tp): per layer dense 12288 / 2 + 128 + 256 = 6528, experts 4 x 3 x 64 x 64 / (2 x 2) =
  // 12288; with the embedding, final norm and head: dense 4 x 6528 + 16448 = 42560,
  // experts 49152, 91712 in all. The plan splits dense states over dp x cp = 2 and expert
  // states over dp x cp x tp / (ep x expert tp) = 1: 12 x 42560 / 2 + 12 x 49152 = 845184.
  const Plan plan = shipped_plan("tiny-moe-ep2-tp2");
  const std::optional<MeasuredMemory> memory =
      compare_memory(plan, trace_with({record(0, 0, 91712, 0, 0)}), "t.json");
  ASSERT_TRUE(memory);
  EXPECT_TRUE(memory->mismatches.empty());
  const MemoryTermRow& o = term(memory->ranks[0], "optimizer states");
  EXPECT_EQ(o.predicted_bytes, 845184);
  EXPECT_EQ(o.predicted_parameters, 91712);
  EXPECT_EQ(o.predicted_expert_parameters, 49152);
  EXPECT_EQ(o.predicted_shards, 2);
  EXPECT_EQ(o.predicted_expert_shards, 1);
  EXPECT_NEAR(*o.error_pct(), (8.0 * 91712 - 845184) / 845184 * 100, 1e-9);
  EXPECT_NE(measured_memory_text(memory).find(
                "optimizer states: the plan splits the states of 42560 dense parameters over 2 "
                "rank(s) and of 49152 expert parameters over 1\n"),
            std::string::npos);
}

TEST(MeasuredMemory, PipelineStagesEachAgainstTheirOwn) {
  const Plan plan = shipped_plan("tiny-tp2-pp2");
  const std::optional<MeasuredMemory> memory = compare_memory(
      plan, trace_with({record(0, 0, 53568, 0, 0), record(2, 1, 37120, 0, 0)}), "t.json");
  ASSERT_TRUE(memory);
  EXPECT_TRUE(memory->mismatches.empty());
  EXPECT_EQ(term(memory->ranks[0], "weights").predicted_bytes, 214272);
  EXPECT_EQ(term(memory->ranks[1], "gradients").predicted_bytes, 148480);
}

TEST(MeasuredMemory, ParameterCountMismatchFails) {
  const Plan plan = shipped_plan("tiny-tp2");
  Json r = record(0, 0, kTinyTp2Parameters - 64, 0, 0);  // a norm fewer
  r["optimizer_bytes"] = 8 * kTinyTp2Parameters + 4;     // no whole number of parameters
  const std::optional<MeasuredMemory> memory = compare_memory(plan, trace_with({r}), "t.json");
  ASSERT_TRUE(memory);
  ASSERT_EQ(memory->mismatches.size(), 3u);
  EXPECT_EQ(memory->mismatches[0],
            "measured memory: rank 0 (stage 0): weights: 362496 bytes at 4 per parameter over 1 "
            "shard(s) hold 90624 parameters, but the plan's stage 0 has 90688 parameters");
  EXPECT_NE(memory->mismatches[2].find("are no whole number of parameters"), std::string::npos);
  EXPECT_NE(measured_memory_text(memory).find("90688 != 90624"), std::string::npos);
}

TEST(MeasuredMemory, TraceWithoutRecordHasNoSection) {
  const Plan plan = shipped_plan("tiny-tp2");
  const Json trace = {{"otherData", {{"measured", true}}}};
  EXPECT_FALSE(compare_memory(plan, trace, "t.json"));
  EXPECT_NE(measured_memory_text(std::nullopt).find("no memory record"), std::string::npos);
  EXPECT_TRUE(measured_memory_json(std::nullopt).is_null());
}

TEST(MeasuredMemory, MalformedRecordsNameTheField) {
  const Plan plan = shipped_plan("tiny-tp2");
  const auto message = [&](const Json& trace) {
    try {
      compare_memory(plan, trace, "t.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(trace_with({record(0, 1, 10, 0, 0)})),
            "t.json: /otherData/memory/0/stage: 1, but the plan has 1 stages");
  Json missing = record(0, 0, 10, 0, 0);
  missing.erase("weight_bytes");
  EXPECT_EQ(message(trace_with({missing})),
            "t.json: /otherData/memory/0/weight_bytes: missing or not an integer");
  Json zero = record(0, 0, 10, 0, 0);
  zero["optimizer_bytes_per_parameter"] = 0;
  EXPECT_EQ(message(trace_with({zero})),
            "t.json: /otherData/memory/0/optimizer_bytes_per_parameter: 0 is below 1");
  EXPECT_EQ(message({{"otherData", {{"memory", Json::object()}}}}),
            "t.json: /otherData/memory: not an array");
}

}  // namespace
}  // namespace dhelix
