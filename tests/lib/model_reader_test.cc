#include "lib/model_reader.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dhelix {
namespace {

std::string example(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/models/" + name + ".json";
}

// A valid dense model; tests break one field at a time.
Json valid_model() {
  return Json::parse(R"({
    "schema_version": "1.0.0", "name": "m", "hidden_size": 4096, "ffn_hidden_size": 14336,
    "num_layers": 32, "num_attention_heads": 32, "num_kv_heads": 8, "vocab_size": 128256,
    "max_seq_length": 8192
  })");
}

std::vector<std::string> problems_of(const Json& json) {
  ProblemList problems;
  model_from_json(json, "m.json", problems);
  std::vector<std::string> lines;
  for (const Problem& problem : problems.problems()) lines.push_back(problem.to_string());
  return lines;
}

using Lines = std::vector<std::string>;

TEST(ModelReader, ValidModelHasDefaultsFilledIn) {
  ProblemList problems;
  const ModelSpec m = model_from_json(valid_model(), "m.json", problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.source_file, "m.json");
  EXPECT_EQ(m.norm, NormKind::kRmsNorm);
  EXPECT_EQ(m.activation, ActivationKind::kSwiGlu);
  EXPECT_EQ(m.position, PositionKind::kRope);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.dtype, DType::kBf16);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.is_moe());
  EXPECT_EQ(parameter_count(m), 8030261248);
}

TEST(ModelReader, NormEpsAndRopeBaseDefaultToLlama2sValues) {
  ProblemList problems;
  const ModelSpec m = model_from_json(valid_model(), "m.json", problems);
  EXPECT_FALSE(m.norm_eps.has_value());
  EXPECT_FALSE(m.rope_base.has_value());
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta(), 10000.0);
}

TEST(ModelReader, NormEpsRopeBaseAndAuxLossCoeffAreRead) {
  Json json = valid_model();
  json["norm_eps"] = 1e-6;
  json["rope_base"] = 500000.0;
  json["moe"] = Json::parse(
      R"({"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128, "aux_loss_coeff": 0.02})");
  ProblemList problems;
  const ModelSpec m = model_from_json(json, "m.json", problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-6);
  EXPECT_DOUBLE_EQ(m.rope_theta(), 500000.0);
  EXPECT_DOUBLE_EQ(m.moe->aux_loss_weight(), 0.02);
  json["moe"].erase("aux_loss_coeff");
  EXPECT_DOUBLE_EQ(model_from_json(json, "m.json", problems).moe->aux_loss_weight(), 0.01);
}

TEST(ModelReader, NormEpsRopeBaseAndAuxLossCoeffOutOfRangeAreNamed) {
  Json json = valid_model();
  json["norm_eps"] = 0;
  json["rope_base"] = 1;
  json["moe"] = Json::parse(
      R"({"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128, "aux_loss_coeff": 2})");
  EXPECT_EQ(problems_of(json), (Lines{"m.json: /norm_eps: 0 must be greater than 0",
                                      "m.json: /rope_base: 1 must be greater than 1",
                                      "m.json: /moe/aux_loss_coeff: 2 must be at most 1"}));
}

TEST(ModelReader, ModelWithoutTheNewKeysDumpsAsBefore) {
  // Plans hash model_to_json: a model file without norm_eps, rope_base or aux_loss_coeff
  // must dump without them so that its plans keep their hashes.
  const std::string dump = model_to_json(read_model_file(example("llama-tiny"))).dump();
  EXPECT_EQ(dump.find("norm_eps"), std::string::npos);
  EXPECT_EQ(dump.find("rope_base"), std::string::npos);
  Json json = valid_model();
  json["rope_base"] = 500000.0;
  ProblemList problems;
  EXPECT_NE(model_to_json(model_from_json(json, "m.json", problems)).dump().find("\"rope_base\""),
            std::string::npos);
}

TEST(ModelReader, WrongTypeIsReported) {
  Json json = valid_model();
  json["hidden_size"] = "4096";
  EXPECT_EQ(problems_of(json),
            Lines{"m.json: /hidden_size: \"4096\" is string, expected an integer"});
}

TEST(ModelReader, NegativeSizeIsReported) {
  Json json = valid_model();
  json["num_layers"] = -2;
  EXPECT_EQ(problems_of(json), Lines{"m.json: /num_layers: -2 must be at least 1"});
}

TEST(ModelReader, UnknownKeySuggestsTheKnownOne) {
  Json json = valid_model();
  json["tied_embedding"] = true;
  EXPECT_EQ(problems_of(json),
            Lines{"m.json: /tied_embedding: unknown key (did you mean \"tied_embeddings\"?)"});
}

TEST(ModelReader, MissingRequiredFieldIsReported) {
  Json json = valid_model();
  json.erase("vocab_size");
  EXPECT_EQ(problems_of(json), Lines{"m.json: /vocab_size: is required but missing"});
}

TEST(ModelReader, HiddenSizeMustSplitIntoHeads) {
  Json json = valid_model();
  json["hidden_size"] = 4100;
  EXPECT_EQ(problems_of(json),
            Lines{"m.json: /hidden_size: 4100 is not divisible by num_attention_heads = 32"});
  json["head_dim"] = 128;  // an explicit head_dim lifts the rule
  EXPECT_EQ(problems_of(json), Lines{});
}

TEST(ModelReader, KvHeadsMustDivideHeads) {
  Json json = valid_model();
  json["num_kv_heads"] = 5;
  EXPECT_EQ(problems_of(json),
            Lines{"m.json: /num_kv_heads: 5 does not divide num_attention_heads = 32"});
}

TEST(ModelReader, TopKMustNotExceedExperts) {
  Json json = valid_model();
  json["moe"] = {{"num_experts", 2}, {"top_k", 4}, {"expert_ffn_hidden_size", 6400}};
  EXPECT_EQ(problems_of(json), Lines{"m.json: /moe/top_k: 4 must be at most num_experts = 2"});
}

// Bounds keep byte, FLOP and parameter counts inside int64 (docs/jobs.md, "Limits").
TEST(ModelReader, SizesAreBoundedSoCountsCannotOverflow) {
  Json json = valid_model();
  json["hidden_size"] = 1e12;  // once aborted the profiler with an int64 overflow
  json["ffn_hidden_size"] = 1048577;
  json["num_layers"] = 65537;
  json["num_attention_heads"] = 65537;
  json["num_kv_heads"] = 65537;
  json["head_dim"] = 16385;
  json["vocab_size"] = int64_t{1} << 62;  // once gave a wrong plan
  json["max_seq_length"] = 16777217;
  json["moe"] = {{"num_experts", 65537},
                 {"top_k", 65537},
                 {"capacity_factor", 1000.5},
                 {"expert_ffn_hidden_size", 1048577}};
  EXPECT_EQ(problems_of(json),
            (Lines{"m.json: /hidden_size: 1000000000000 must be at most 1048576",
                   "m.json: /num_layers: 65537 must be at most 65536",
                   "m.json: /num_attention_heads: 65537 must be at most 65536",
                   "m.json: /num_kv_heads: 65537 must be at most 65536",
                   "m.json: /head_dim: 16385 must be at most 16384",
                   "m.json: /vocab_size: 4611686018427387904 must be at most 16777216",
                   "m.json: /max_seq_length: 16777217 must be at most 16777216",
                   "m.json: /moe/num_experts: 65537 must be at most 65536",
                   "m.json: /moe/top_k: 65537 must be at most 65536",
                   "m.json: /moe/capacity_factor: 1000.5 must be at most 1000",
                   "m.json: /moe/expert_ffn_hidden_size: 1048577 must be at most 1048576",
                   "m.json: /ffn_hidden_size: 1048577 must be at most 1048576"}));
}

TEST(ModelReader, SizesAtTheBoundsAreAccepted) {
  Json json = valid_model();
  json["hidden_size"] = 1048576;
  json["ffn_hidden_size"] = 1048576;
  json["num_layers"] = 65536;
  json["num_attention_heads"] = 65536;
  json["num_kv_heads"] = 65536;
  json["vocab_size"] = 16777216;
  json["max_seq_length"] = 16777216;
  json["moe"] = {{"num_experts", 65536},
                 {"top_k", 65536},
                 {"capacity_factor", 1000},
                 {"expert_ffn_hidden_size", 1048576}};
  EXPECT_EQ(problems_of(json), Lines{});
  json["head_dim"] = 16384;
  EXPECT_EQ(problems_of(json), Lines{});
}

TEST(ModelReader, MoeObjectIsStrictAndNeedsItsFields) {
  Json json = valid_model();
  json["moe"] = {{"num_expert", 2}, {"top_k", 1}};
  EXPECT_EQ(problems_of(json),
            (Lines{"m.json: /moe/num_experts: is required but missing",
                   "m.json: /moe/expert_ffn_hidden_size: is required but missing",
                   "m.json: /moe/num_expert: unknown key (did you mean \"num_experts\"?)"}));
}

TEST(ModelReader, DenseModelNeedsFfnSizeButMoeDoesNot) {
  Json json = valid_model();
  json.erase("ffn_hidden_size");
  EXPECT_EQ(problems_of(json), Lines{"m.json: /ffn_hidden_size: is required but missing"});
  json["moe"] = {{"num_experts", 8}, {"top_k", 2}, {"expert_ffn_hidden_size", 14336}};
  EXPECT_EQ(problems_of(json), Lines{});
}

TEST(ModelReader, BadEnumValueListsTheChoices) {
  Json json = valid_model();
  json["norm"] = "rmsnrom";
  EXPECT_EQ(problems_of(json),
            Lines{"m.json: /norm: \"rmsnrom\" is not one of rmsnorm, layernorm (did you mean "
                  "\"rmsnorm\"?)"});
}

TEST(ModelReader, EveryProblemOfAFileIsCollected) {
  Json json = valid_model();
  json["num_layers"] = 0;
  json["num_kv_heads"] = 3;
  json["dtype"] = "fp8";
  json.erase("name");
  EXPECT_EQ(
      problems_of(json),
      (Lines{"m.json: /name: is required but missing",
             "m.json: /dtype: \"fp8\" is not one of bf16, fp16, fp32 (did you mean \"fp16\"?)",
             "m.json: /num_layers: 0 must be at least 1",
             "m.json: /num_kv_heads: 3 does not divide num_attention_heads = 32"}));
}

TEST(ModelReader, OtherMajorSchemaVersionIsRefused) {
  Json json = valid_model();
  json["schema_version"] = "2.0.0";
  ProblemList problems;
  try {
    model_from_json(json, "m.json", problems);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kSchemaVersion);
  }
}

TEST(ModelReader, ReadModelFileThrowsEveryProblemAtOnce) {
  try {
    read_model_file(std::string(DHELIX_SOURCE_DIR) + "/schemas/model.schema.json");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(error.what()).find("neither a dhelix model file"), std::string::npos);
  }
}

TEST(ModelReader, PaperModelsReadWithTheirSizes) {
  struct Case {
    const char* name;
    int64_t hidden, layers, heads;
    int64_t parameters;
  };
  // Counts by the layer formulas of model_spec.cc (hand-checked); the paper's names round
  // them (llama-39b counts 42.5B with Llama 3's 128K vocabulary).
  const Case cases[] = {
      {"llama-8b", 4096, 32, 32, 8030261248},     {"llama-25b", 8192, 28, 64, 26059677696},
      {"llama-39b", 16384, 12, 128, 42455154688}, {"llama-66b", 8192, 76, 64, 67131088896},
      {"gpt-6.7b", 4096, 32, 32, 6717124608},     {"gpt-18b", 6144, 40, 48, 18532042752},
      {"gpt-30b", 12288, 16, 96, 29812494336},    {"phi-16b", 4096, 12, 32, 15866593280},
      {"phi-31b", 4096, 24, 32, 31470510080},     {"phi-42b", 4096, 32, 32, 41873121280},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ModelSpec m = read_model_file(example(c.name));
    EXPECT_EQ(m.name, c.name);
    EXPECT_EQ(m.hidden_size, c.hidden);
    EXPECT_EQ(m.num_layers, c.layers);
    EXPECT_EQ(m.num_attention_heads, c.heads);
    EXPECT_EQ(parameter_count(m), c.parameters);
  }
}

TEST(ModelReader, PhiModelsCarryThePapersCapacityFactors) {
  const ModelSpec phi31 = read_model_file(example("phi-31b"));
  ASSERT_TRUE(phi31.is_moe());
  EXPECT_EQ(phi31.moe->num_experts, 16);
  EXPECT_EQ(phi31.moe->top_k, 2);
  EXPECT_EQ(phi31.moe->expert_ffn_hidden_size, 6400);
  EXPECT_DOUBLE_EQ(phi31.moe->capacity_factor, 6.0);
  EXPECT_DOUBLE_EQ(read_model_file(example("phi-42b")).moe->capacity_factor, 8.0);
  EXPECT_DOUBLE_EQ(read_model_file(example("phi-16b")).moe->capacity_factor, 0.0);
}

TEST(ModelReader, GptModelsAreLayerNormGeluLearnedWithBiases) {
  const ModelSpec m = read_model_file(example("gpt-18b"));
  EXPECT_EQ(m.norm, NormKind::kLayerNorm);
  EXPECT_EQ(m.activation, ActivationKind::kGelu);
  EXPECT_EQ(m.position, PositionKind::kLearned);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.ffn_hidden_size, 24576);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.vocab_size, 50257);
}

void expect_same_model(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.ffn_hidden_size, b.ffn_hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_length, b.max_seq_length);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.linear_bias, b.linear_bias);
  EXPECT_EQ(a.dtype, b.dtype);
  ASSERT_EQ(a.is_moe(), b.is_moe());
  if (a.is_moe()) {
    EXPECT_EQ(a.moe->num_experts, b.moe->num_experts);
    EXPECT_EQ(a.moe->top_k, b.moe->top_k);
    EXPECT_DOUBLE_EQ(a.moe->capacity_factor, b.moe->capacity_factor);
    EXPECT_EQ(a.moe->expert_ffn_hidden_size, b.moe->expert_ffn_hidden_size);
    EXPECT_EQ(a.moe->aux_loss_coeff, b.moe->aux_loss_coeff);
  }
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_base, b.rope_base);
}

TEST(ModelReader, ModelToJsonRoundTrips) {
  const std::string hf = std::string(DHELIX_SOURCE_DIR) + "/examples/models/hf/";
  for (const std::string& path : {example("llama-8b"), example("gpt-6.7b"), example("phi-31b"),
                                  hf + "mixtral-8x7b-v0.1.config.json", hf + "gpt2.config.json"}) {
    SCOPED_TRACE(path);
    const ModelSpec original = read_model_file(path);
    ProblemList problems;
    const ModelSpec copy =
        model_from_json(Json::parse(model_to_json(original).dump()), "copy.json", problems);
    EXPECT_TRUE(problems.empty());
    expect_same_model(original, copy);
  }
}

TEST(ModelReader, ModelToJsonWritesStableKeyOrder) {
  const OrderedJson json = model_to_json(read_model_file(example("phi-16b")));
  std::vector<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.push_back(key);
  EXPECT_EQ(keys,
            (Lines{"schema_version", "name", "norm", "activation", "position", "hidden_size",
                   "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
                   "max_seq_length", "tied_embeddings", "linear_bias", "dtype", "moe"}));
}

}  // namespace
}  // namespace dhelix
