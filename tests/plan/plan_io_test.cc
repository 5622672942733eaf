#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "lib/plan/plan.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/plan_writer.h"
#include "lib/provenance.h"

namespace dhelix {
namespace {

// A small but complete plan: one pairing of one block, one stage of two tasks.
Plan small_plan() {
  Plan plan;
  plan.meta = OrderedJson{{"tool", "dhelix-plan"}, {"version", "0.1.0"}};
  // read_plan checks that /inputs hash the plan's own /job.
  plan.inputs.model = {.name = "tiny", .sha256 = sha256_hex(OrderedJson{{"name", "tiny"}}.dump())};
  plan.inputs.parallel = OrderedJson{{"tp", 2}, {"dp", 1}};
  plan.inputs.cluster = {.name = "a40", .sha256 = sha256_hex(OrderedJson{{"name", "a40"}}.dump())};
  plan.inputs.profile = {.name = "model", .sha256 = "generated:model"};
  plan.job = {.name = "tiny-job",
              .model = OrderedJson{{"name", "tiny"}},
              .cluster = OrderedJson{{"name", "a40"}},
              .parallel = OrderedJson{{"tp", 2}, {"dp", 1}}};
  plan.num_micro_batches = 2;
  PlanPairing pairing;
  pairing.forward_ops = {{.id = "fwd.gemm",
                          .kind = OpKind::kGemm,
                          .stream = StreamClass::kCompute,
                          .group = std::nullopt,
                          .signature = "gemm:bf16:m=1,n=2,k=3",
                          .solo_us = 10.0004}};
  pairing.backward_ops = {{.id = "bwd.rs",
                           .kind = OpKind::kReduceScatter,
                           .stream = StreamClass::kLocalComm,
                           .group = ParallelDim::kTp,
                           .signature = "reduce_scatter:bf16:bytes=8:tp2:local",
                           .solo_us = 1.0 / 3.0}};
  pairing.scope = PairingScope::kLayer;
  pairing.chunk_layers = 1;
  pairing.layer_scope_us = 10;
  pairing.chunk_scope_us = 10;
  pairing.window_layers = 1;
  pairing.sequential_us = 10.333;
  pairing.layer_pair_us = 10;
  pairing.layer_blocks = {
      {.time_us = 10,
       .forward_ops = {"fwd.gemm"},
       .backward_ops = {"bwd.rs"},
       .timings = {
           {.strand = Pass::kBackward, .op = "bwd.rs", .start_us = 0, .finish_us = 1.0 / 3.0},
           {.strand = Pass::kForward, .op = "fwd.gemm", .start_us = 0, .finish_us = 10}}}};
  plan.pairings = {pairing};
  PlanStage stage;
  stage.ranks = {0, 1};
  stage.down_layers = {0, 1};
  stage.up_layers = {1, 1};
  stage.embedding = stage.head_loss = true;
  PlanTask forward{
      .index = 0,
      .kind = TaskKind::kForward,
      .label = "F0d",
      .forward = PlanTaskPart{.micro_batch = 0, .chunk = ChunkSide::kDown, .layers = {0, 1}},
      .backward = std::nullopt,
      .head_loss_micro_batch = -1,
      .start_us = 0,
      .end_us = 10,
      .waits_for = {}};
  PlanTask head{.index = 1,
                .kind = TaskKind::kHeadLoss,
                .label = "H0",
                .forward = std::nullopt,
                .backward = std::nullopt,
                .head_loss_micro_batch = 0,
                .start_us = 10,
                .end_us = 12,
                .waits_for = {}};
  stage.tasks = {forward, head};
  plan.stages = {stage};
  plan.memory_budget = {
      .gpu = "A40", .capacity_bytes = 100, .reserve_bytes = 10, .usable_bytes = 90};
  for (PipelineScheme name : kPipelineSchemeNames.values()) {
    PlanScheme s;
    s.scheme = name;
    s.shape = name == PipelineScheme::kDHelix || name == PipelineScheme::kWaveletPlus
                  ? PipelineShape::kW
                  : PipelineShape::kOneFOneB;
    s.iteration_us = 12;
    s.bubble_ratio = 0.1234567;
    s.speedup_vs_megatron = 1;
    for (ParallelDim type : kParallelDimNames.values()) s.comm.push_back({.type = type});
    s.memory = {{.stage = 0, .weight_bytes = 1, .total_bytes = 1}};
    plan.schemes.push_back(s);
  }
  return plan;
}

std::string error_of(const std::string& text, ErrorCode* code = nullptr) {
  try {
    plan_from_json(Json::parse(text), "plan.json");
  } catch (const Error& error) {
    if (code != nullptr) *code = error.code();
    return error.what();
  }
  return "";
}

TEST(PlanIo, WriterRoundsTimesAndRatios) {
  const OrderedJson json = plan_to_json(small_plan());
  EXPECT_EQ(json["pairings"][0]["forward_ops"][0]["solo_us"].dump(), "10.0");
  EXPECT_EQ(json["pairings"][0]["backward_ops"][0]["solo_us"].dump(), "0.333");
  EXPECT_EQ(json["schemes"][0]["bubble_ratio"].dump(), "0.123457");
  EXPECT_TRUE(json["stages"][0]["tasks"][1]["forward"].is_null());
}

TEST(PlanIo, ReadBackAndWrittenAgainGivesTheSameBytes) {
  const std::string text = plan_to_text(small_plan());
  const Plan read = plan_from_json(Json::parse(text), "plan.json");
  ASSERT_TRUE(read.stages[0].tasks[0].forward.has_value());
  EXPECT_EQ(read.stages[0].tasks[0].forward->chunk, ChunkSide::kDown);
  EXPECT_EQ(read.stages[0].tasks[1].head_loss_micro_batch, 0);
  EXPECT_FALSE(read.stages[0].tasks[1].forward.has_value());
  // plan_from_json sorts the opaque objects' keys; small_plan's are written sorted-unfriendly
  // ("tp" before "dp"), so compare after one more round, and read_plan keeps file order.
  const std::string again = plan_to_text(plan_from_json(Json::parse(plan_to_text(read)), "p"));
  EXPECT_EQ(plan_to_text(read), again);
  EXPECT_EQ(read.schemes[0].bubble_ratio, 0.123457);
}

TEST(PlanIo, ReadPlanKeepsFileBytes) {
  const std::string path = ::testing::TempDir() + "/plan_io_test_plan.json";
  write_plan(path, small_plan());
  EXPECT_EQ(plan_to_text(read_plan(path)), plan_to_text(small_plan()));
}

TEST(PlanIo, UnknownKeyIsRefusedWithSuggestion) {
  Json json = Json::parse(plan_to_text(small_plan()));
  json["stages"][0]["tasks"][0]["strat_us"] = 1;
  EXPECT_EQ(error_of(json.dump()),
            "plan.json: /stages/0/tasks/0/strat_us: unknown key (did you mean \"start_us\"?)");
}

TEST(PlanIo, WrongValuesAreNamedByPointer) {
  Json json = Json::parse(plan_to_text(small_plan()));
  json["stages"][0]["tasks"][0]["kind"] = "sideways";
  json["schemes"][1]["iteration_us"] = -1;
  json["stages"][0]["pairing"] = 3;
  const std::string message = error_of(json.dump());
  EXPECT_NE(message.find("plan.json: /stages/0/tasks/0/kind: \"sideways\""), std::string::npos)
      << message;
  EXPECT_NE(message.find("plan.json: /schemes/1/iteration_us: -"), std::string::npos) << message;
  // Cross references are checked once the shape is right.
  json = Json::parse(plan_to_text(small_plan()));
  json["stages"][0]["pairing"] = 3;
  EXPECT_EQ(error_of(json.dump()),
            "plan.json: /stages/0/pairing: 3 must name one of the 1 pairings");
}

TEST(PlanIo, StagePhasesRoundTripAndOlderPlansLackThem) {
  Plan plan = small_plan();
  const std::string without = plan_to_text(plan);
  EXPECT_EQ(without.find("\"phases\""), std::string::npos);
  EXPECT_FALSE(plan_from_json(Json::parse(without), "p").stages[0].phases.has_value());
  plan.stages[0].phases = PlanStagePhases{.p2p_us = 1.5,
                                          .p2p_stream = StreamClass::kLocalComm,
                                          .dp_reduce_hidden_us = 2,
                                          .dp_reduce_exposed_us = 3.0004,
                                          .dp_gather_hidden_us = 4,
                                          .dp_gather_exposed_us = 5,
                                          .dp_stream = StreamClass::kCrossComm,
                                          .optimizer_us = 6};
  const std::string text = plan_to_text(plan);
  const Plan read = plan_from_json(Json::parse(text), "p");
  ASSERT_TRUE(read.stages[0].phases.has_value());
  EXPECT_EQ(read.stages[0].phases->p2p_stream, StreamClass::kLocalComm);
  EXPECT_EQ(read.stages[0].phases->dp_reduce_exposed_us, 3.0);
  EXPECT_DOUBLE_EQ(read.stages[0].phases->tail_us(), 3 + 6 + 5);
  EXPECT_EQ(plan_to_json(read)["stages"][0]["phases"], plan_to_json(plan)["stages"][0]["phases"]);
  Json json = Json::parse(text);
  json["stages"][0]["phases"]["dp_stream"] = "compute";
  EXPECT_NE(error_of(json.dump()).find("plan.json: /stages/0/phases/dp_stream: \"compute\""),
            std::string::npos)
      << error_of(json.dump());
}

TEST(PlanIo, SegmentBoundsAreWrittenOnlyWhenTheBudgetSetThem) {
  Plan plan = small_plan();
  const std::string without = plan_to_text(plan);
  EXPECT_EQ(without.find("segment_bound"), std::string::npos);
  EXPECT_EQ(plan_from_json(Json::parse(without), "p").pairings[0].layer_segment_bound, 0);
  plan.pairings[0].layer_segment_bound = 6;
  plan.pairings[0].window_segment_bound = 4;
  const Plan read = plan_from_json(Json::parse(plan_to_text(plan)), "p");
  EXPECT_EQ(read.pairings[0].layer_segment_bound, 6);
  EXPECT_EQ(read.pairings[0].window_segment_bound, 4);
  Json json = Json::parse(plan_to_text(plan));
  json["pairings"][0]["layer_segment_bound"] = 0;
  EXPECT_NE(error_of(json.dump()).find("plan.json: /pairings/0/layer_segment_bound: 0"),
            std::string::npos)
      << error_of(json.dump());
}

TEST(PlanIo, FsdpOptionsAreWrittenOnlyWithMegatronFsdpAndRoundTrip) {
  Plan plan = small_plan();
  EXPECT_STREQ(plan_schema_version(plan.options), "1.3.0");  // no FSDP: the older format
  const std::string without = plan_to_text(plan);
  EXPECT_EQ(without.find("\"fsdp\""), std::string::npos);
  EXPECT_FALSE(plan_from_json(Json::parse(without), "p").options.fsdp.has_value());
  plan.options.fsdp = PlanFsdpRecord{.sharding_strategy = FsdpShardingStrategy::kOptimGradsParams,
                                     .reshard_after_forward = false};
  plan.schema_version = plan_schema_version(plan.options);
  EXPECT_EQ(plan.schema_version, "1.4.0");
  const OrderedJson json = plan_to_json(plan);
  EXPECT_EQ(json["options"]["fsdp"].dump(),
            R"({"sharding_strategy":"optim_grads_params","reshard_after_forward":false})");
  const Plan read = plan_from_json(Json::parse(plan_to_text(plan)), "p");
  ASSERT_TRUE(read.options.fsdp.has_value());
  EXPECT_EQ(*read.options.fsdp, *plan.options.fsdp);
  EXPECT_EQ(read.schema_version, "1.4.0");
  Json bad = Json::parse(plan_to_text(plan));
  bad["options"]["fsdp"]["sharding_strategy"] = "zero3";
  EXPECT_NE(error_of(bad.dump()).find("plan.json: /options/fsdp/sharding_strategy: \"zero3\""),
            std::string::npos)
      << error_of(bad.dump());
}

TEST(PlanIo, OlderMinorVersionWithoutChunksPerStageReads) {
  // 1.0.0 plans had no chunks_per_stage and no baseline schemes: the shape gives the chunks.
  Json json = Json::parse(plan_to_text(small_plan()));
  json["schema_version"] = "1.0.0";
  for (Json& scheme : json["schemes"]) scheme.erase("chunks_per_stage");
  const Plan plan = plan_from_json(json, "old.json");
  ASSERT_FALSE(plan.schemes.empty());
  for (const PlanScheme& s : plan.schemes) {
    EXPECT_EQ(s.chunks_per_stage, s.shape == PipelineShape::kW ? 2 : 1)
        << pipeline_scheme_name(s.scheme);
  }
  EXPECT_EQ(plan.schema_version, "1.0.0");
}

TEST(PlanIo, NewSchemesAndShapesRead) {
  Json json = Json::parse(plan_to_text(small_plan()));
  json["schemes"][1]["scheme"] = "megatron-interleaved";
  json["schemes"][1]["shape"] = "interleaved";
  json["schemes"][1]["chunks_per_stage"] = 5;
  const Plan plan = plan_from_json(json, "plan.json");
  ASSERT_NE(plan.find_scheme(PipelineScheme::kMegatronInterleaved), nullptr);
  EXPECT_EQ(plan.find_scheme(PipelineScheme::kMegatronInterleaved)->chunks_per_stage, 5);
  json["schemes"][1]["shape"] = "zigzag";
  EXPECT_NE(error_of(json.dump()).find("/schemes/1/shape"), std::string::npos);
}

TEST(PlanIo, OtherMajorVersionIsRefused) {
  Json json = Json::parse(plan_to_text(small_plan()));
  json["schema_version"] = "2.0.0";
  ErrorCode code = ErrorCode::kInternal;
  EXPECT_EQ(error_of(json.dump(), &code),
            "plan.json: /schema_version: \"2.0.0\" has major version 2, this dhelix reads major "
            "version 1 only");
  EXPECT_EQ(code, ErrorCode::kSchemaVersion);
}

// Interleaved stages (1.5.0): a stage's model_chunks and a part's model_chunk round-trip,
// are written only when set, and a part naming a chunk the stage lacks, or other layers than
// its chunk's, is refused naming the field and the value.
TEST(PlanIo, ModelChunksRoundTripAndAreChecked) {
  const std::string plain = plan_to_text(small_plan());
  EXPECT_EQ(plain.find("model_chunk"), std::string::npos);
  Plan plan = small_plan();
  PlanStage& stage = plan.stages[0];
  stage.down_layers = stage.up_layers = {0, 0};
  stage.model_chunks = {{0, 1}, {1, 1}};
  stage.tasks[0].forward->chunk = ChunkSide::kWhole;
  stage.tasks[0].forward->model_chunk = 0;
  const Plan read = plan_from_json(Json::parse(plan_to_text(plan)), "p");
  ASSERT_EQ(read.stages[0].model_chunks.size(), 2u);
  EXPECT_EQ(read.stages[0].model_chunks[1].first, 1);
  EXPECT_EQ(read.stages[0].tasks[0].forward->model_chunk, 0);
  EXPECT_EQ(read.stages[0].layer_ranges().size(), 2u);
  // (One more round: plan_from_json sorts the opaque objects' keys, as above.)
  EXPECT_EQ(plan_to_text(plan_from_json(Json::parse(plan_to_text(read)), "p")), plan_to_text(read));

  Json json = Json::parse(plan_to_text(plan));
  json["stages"][0]["tasks"][0]["forward"]["model_chunk"] = 2;
  EXPECT_EQ(error_of(json.dump()),
            "plan.json: /stages/0/tasks/0/forward/model_chunk: 2 must name one of the stage's 2 "
            "model_chunks (0..1)");
  json["stages"][0]["tasks"][0]["forward"]["model_chunk"] = 1;
  EXPECT_EQ(error_of(json.dump()),
            "plan.json: /stages/0/tasks/0/forward/model_chunk: 1 names model chunk 1, layers "
            "1..1, but the part runs layers 0..0");
  json["stages"][0]["tasks"][0]["forward"].erase("model_chunk");
  EXPECT_NE(error_of(json.dump())
                .find("/stages/0/tasks/0/forward/model_chunk: (absent) must name "
                      "one of the stage's 2 model_chunks"),
            std::string::npos);
  json = Json::parse(plain);
  json["stages"][0]["tasks"][0]["forward"]["model_chunk"] = 0;
  EXPECT_NE(error_of(json.dump())
                .find("/stages/0/tasks/0/forward/model_chunk: 0 names a model "
                      "chunk, but the stage has no model_chunks"),
            std::string::npos);
}

}  // namespace
}  // namespace dhelix
