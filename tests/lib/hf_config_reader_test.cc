#include "lib/hf_config_reader.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dhelix {
namespace {

std::string hf_example(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/models/hf/" + name + ".config.json";
}

std::vector<std::string> problems_of(const Json& json) {
  ProblemList problems;
  model_from_hf_config(json, "config.json", problems);
  std::vector<std::string> lines;
  for (const Problem& problem : problems.problems()) lines.push_back(problem.to_string());
  return lines;
}

std::string unsupported_message(const Json& json) {
  ProblemList problems;
  try {
    model_from_hf_config(json, "config.json", problems);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    return error.what();
  }
  return "(no error)";
}

using Lines = std::vector<std::string>;

TEST(HfConfigReader, Llama3_8b) {
  const ModelSpec m = read_model_file(hf_example("llama-3-8b"));
  EXPECT_EQ(m.name, "llama-3-8b");
  EXPECT_EQ(m.norm, NormKind::kRmsNorm);
  EXPECT_EQ(m.activation, ActivationKind::kSwiGlu);
  EXPECT_EQ(m.position, PositionKind::kRope);
  EXPECT_EQ(m.hidden_size, 4096);
  EXPECT_EQ(m.ffn_hidden_size, 14336);
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(m.num_attention_heads, 32);
  EXPECT_EQ(m.num_kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.max_seq_length, 8192);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.linear_bias);
  EXPECT_EQ(m.dtype, DType::kBf16);
  EXPECT_FALSE(m.is_moe());
  EXPECT_EQ(parameter_count(m), 8030261248);   // published count
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-5);    // rms_norm_eps
  EXPECT_DOUBLE_EQ(m.rope_theta(), 500000.0);  // rope_theta
}

TEST(HfConfigReader, Llama3_70b) {
  const ModelSpec m = read_model_file(hf_example("llama-3-70b"));
  EXPECT_EQ(m.num_layers, 80);
  EXPECT_EQ(m.num_attention_heads, 64);
  EXPECT_EQ(m.num_kv_heads, 8);
  EXPECT_EQ(parameter_count(m), 70553706496);  // published count
}

TEST(HfConfigReader, Mixtral8x7b) {
  const ModelSpec m = read_model_file(hf_example("mixtral-8x7b-v0.1"));
  ASSERT_TRUE(m.is_moe());
  EXPECT_EQ(m.moe->num_experts, 8);
  EXPECT_EQ(m.moe->top_k, 2);
  EXPECT_EQ(m.moe->expert_ffn_hidden_size, 14336);
  EXPECT_DOUBLE_EQ(m.moe->capacity_factor, 0.0);
  EXPECT_EQ(m.ffn_hidden_size, 0);
  EXPECT_EQ(m.norm, NormKind::kRmsNorm);
  EXPECT_EQ(m.vocab_size, 32000);
  EXPECT_EQ(m.max_seq_length, 32768);
  EXPECT_EQ(parameter_count(m), 46702792704);         // "46.7B"
  EXPECT_EQ(active_parameter_count(m), 12879925248);  // "12.9B active"
  EXPECT_DOUBLE_EQ(m.rope_theta(), 1e6);
  EXPECT_DOUBLE_EQ(m.moe->aux_loss_weight(), 0.02);  // router_aux_loss_coef
}

TEST(HfConfigReader, NormEpsilonKeysOfEachFamily) {
  EXPECT_DOUBLE_EQ(read_model_file(hf_example("qwen2.5-7b")).norm_epsilon(), 1e-6);
  EXPECT_DOUBLE_EQ(read_model_file(hf_example("gpt2")).norm_epsilon(), 1e-5);
  const ModelSpec neox = read_model_file(hf_example("gpt-neox-20b"));
  EXPECT_DOUBLE_EQ(neox.norm_epsilon(), 1e-5);
  EXPECT_DOUBLE_EQ(neox.rope_theta(), 10000.0);
  EXPECT_DOUBLE_EQ(read_model_file(hf_example("qwen1.5-moe-a2.7b")).moe->aux_loss_weight(), 0.001);
}

TEST(HfConfigReader, BadRopeThetaIsNamed) {
  Json json = Json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "vocab_size": 256, "rope_theta": -1, "rms_norm_eps": "small"})");
  EXPECT_EQ(problems_of(json),
            (Lines{"config.json: /rms_norm_eps: \"small\" is string, expected a number",
                   "config.json: /rope_theta: -1 must be greater than 1"}));
}

TEST(HfConfigReader, Phi35Moe) {
  const ModelSpec m = read_model_file(hf_example("phi-3.5-moe-instruct"));
  EXPECT_EQ(m.name, "Phi-3.5-MoE-instruct");  // from _name_or_path
  EXPECT_EQ(m.norm, NormKind::kLayerNorm);
  EXPECT_EQ(m.activation, ActivationKind::kSwiGlu);
  EXPECT_TRUE(m.linear_bias);
  ASSERT_TRUE(m.is_moe());
  EXPECT_EQ(m.moe->num_experts, 16);
  EXPECT_EQ(m.moe->top_k, 2);
  EXPECT_EQ(m.moe->expert_ffn_hidden_size, 6400);
  EXPECT_EQ(m.num_kv_heads, 8);
  EXPECT_EQ(m.vocab_size, 32064);
  EXPECT_EQ(m.max_seq_length, 131072);
  // 41.9B published = this + the 32,064 lm_head biases dhelix leaves out.
  EXPECT_EQ(parameter_count(m), 41873121280);
  EXPECT_EQ(active_parameter_count(m), 6640967680);  // "6.6B active"
}

TEST(HfConfigReader, Gpt2) {
  const ModelSpec m = read_model_file(hf_example("gpt2"));
  EXPECT_EQ(m.name, "gpt2");
  EXPECT_EQ(m.norm, NormKind::kLayerNorm);
  EXPECT_EQ(m.activation, ActivationKind::kGelu);
  EXPECT_EQ(m.position, PositionKind::kLearned);
  EXPECT_EQ(m.hidden_size, 768);
  EXPECT_EQ(m.ffn_hidden_size, 3072);  // n_inner absent: 4·n_embd
  EXPECT_EQ(m.num_layers, 12);
  EXPECT_EQ(m.num_attention_heads, 12);
  EXPECT_EQ(m.num_kv_heads, 12);
  EXPECT_EQ(m.max_seq_length, 1024);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_EQ(m.dtype, DType::kBf16);          // no torch_dtype: dhelix's training default
  EXPECT_EQ(parameter_count(m), 124439808);  // published count
}

TEST(HfConfigReader, Gpt2NullInnerMeansFourTimesHidden) {
  Json json = read_json_file(hf_example("gpt2"));
  json["n_inner"] = nullptr;
  ProblemList problems;
  EXPECT_EQ(model_from_hf_config(json, "config.json", problems).ffn_hidden_size, 3072);
  json["n_inner"] = 2048;
  EXPECT_EQ(model_from_hf_config(json, "config.json", problems).ffn_hidden_size, 2048);
  EXPECT_TRUE(problems.empty());
}

TEST(HfConfigReader, GptNeoX20b) {
  const ModelSpec m = read_model_file(hf_example("gpt-neox-20b"));
  EXPECT_EQ(m.norm, NormKind::kLayerNorm);
  EXPECT_EQ(m.activation, ActivationKind::kGelu);
  EXPECT_EQ(m.position, PositionKind::kRope);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.num_layers, 44);
  EXPECT_EQ(m.num_attention_heads, 64);
  EXPECT_EQ(m.num_kv_heads, 64);
  EXPECT_EQ(m.vocab_size, 50432);
  EXPECT_EQ(m.dtype, DType::kFp16);
  EXPECT_EQ(parameter_count(m), 20554567680);  // published count
}

TEST(HfConfigReader, MistralIsReadAsLlama) {
  Json json = read_json_file(hf_example("llama-3-8b"));
  json["architectures"] = {"MistralForCausalLM"};
  json["model_type"] = "mistral";
  json["head_dim"] = nullptr;  // published Mistral configs may carry a null head_dim
  ProblemList problems;
  const ModelSpec m = model_from_hf_config(json, "mistral/config.json", problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(m.name, "mistral");  // a bare config.json is named after its folder
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(parameter_count(m), 8030261248);
}

TEST(HfConfigReader, ModelTypeAloneIsEnough) {
  Json json = read_json_file(hf_example("mixtral-8x7b-v0.1"));
  json.erase("architectures");
  ProblemList problems;
  EXPECT_TRUE(model_from_hf_config(json, "config.json", problems).is_moe());
}

TEST(HfConfigReader, UnsupportedArchitectureListsTheSupportedOnes) {
  EXPECT_EQ(unsupported_message(Json::parse(R"({"architectures": ["BertModel"]})")),
            "config.json: /architectures: [\"BertModel\"] is not supported; supported "
            "architectures: LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, "
            "PhiMoEForCausalLM, PhimoeForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, "
            "GPT2LMHeadModel, GPTNeoXForCausalLM");
  EXPECT_EQ(unsupported_message(Json::parse(R"({"model_type": "bert"})")),
            "config.json: /model_type: \"bert\" is not supported; supported model types: llama, "
            "mistral, mixtral, phimoe, gpt2, gpt_neox");
}

TEST(HfConfigReader, UnknownKeysPassButWrongTypesOfKnownKeysDoNot) {
  Json json = read_json_file(hf_example("llama-3-8b"));
  json["some_future_key"] = {{"anything", 1}};
  EXPECT_EQ(problems_of(json), Lines{});
  json["hidden_size"] = "4096";
  json["tie_word_embeddings"] = 0;
  json["torch_dtype"] = "int8";
  EXPECT_EQ(
      problems_of(json),
      (Lines{"config.json: /hidden_size: \"4096\" is string, expected an integer",
             "config.json: /tie_word_embeddings: 0 is an integer, expected true or false",
             "config.json: /torch_dtype: \"int8\" is not one of bfloat16, float16, float32"}));
}

TEST(HfConfigReader, SizesAreBounded) {
  Json gpt2 = read_json_file(hf_example("gpt2"));
  gpt2["n_embd"] = 1e12;
  gpt2["n_inner"] = 1048577;
  gpt2["n_layer"] = 65537;
  gpt2["n_head"] = 65537;
  gpt2["vocab_size"] = int64_t{1} << 62;
  gpt2["n_positions"] = 16777217;
  EXPECT_EQ(problems_of(gpt2),
            (Lines{"config.json: /n_embd: 1000000000000 must be at most 1048576",
                   "config.json: /n_inner: 1048577 must be at most 1048576",
                   "config.json: /n_layer: 65537 must be at most 65536",
                   "config.json: /n_head: 65537 must be at most 65536",
                   "config.json: /vocab_size: 4611686018427387904 must be at most 16777216",
                   "config.json: /n_positions: 16777217 must be at most 16777216"}));
  Json mixtral = read_json_file(hf_example("mixtral-8x7b-v0.1"));
  mixtral["hidden_size"] = 1048577;
  mixtral["num_hidden_layers"] = 65537;
  mixtral["num_key_value_heads"] = 65537;
  mixtral["max_position_embeddings"] = 16777217;
  mixtral["num_local_experts"] = 65537;
  mixtral["num_experts_per_tok"] = 65537;
  mixtral["intermediate_size"] = 1048577;
  mixtral["head_dim"] = 16385;
  EXPECT_EQ(problems_of(mixtral),
            (Lines{"config.json: /hidden_size: 1048577 must be at most 1048576",
                   "config.json: /num_hidden_layers: 65537 must be at most 65536",
                   "config.json: /num_key_value_heads: 65537 must be at most 65536",
                   "config.json: /max_position_embeddings: 16777217 must be at most 16777216",
                   "config.json: /num_local_experts: 65537 must be at most 65536",
                   "config.json: /num_experts_per_tok: 65537 must be at most 65536",
                   "config.json: /intermediate_size: 1048577 must be at most 1048576",
                   "config.json: /head_dim: 16385 must be at most 16384"}));
}

TEST(HfConfigReader, ShapeRulesNameTheHfKeys) {
  Json json = read_json_file(hf_example("mixtral-8x7b-v0.1"));
  json["num_key_value_heads"] = 6;
  json["num_experts_per_tok"] = 9;
  EXPECT_EQ(problems_of(json),
            (Lines{"config.json: /num_key_value_heads: 6 does not divide num_attention_heads = 32",
                   "config.json: /num_experts_per_tok: 9 must be at most num_experts = 8"}));
  Json gpt2 = read_json_file(hf_example("gpt2"));
  gpt2["n_head"] = 7;
  EXPECT_EQ(problems_of(gpt2),
            Lines{"config.json: /n_embd: 768 is not divisible by num_attention_heads = 7"});
}

TEST(HfConfigReader, ActivationMustFitTheFamily) {
  Json json = read_json_file(hf_example("llama-3-8b"));
  json["hidden_act"] = "gelu";
  EXPECT_EQ(problems_of(json),
            Lines{"config.json: /hidden_act: \"gelu\" is not \"silu\", which a SwiGLU MLP needs"});
}

TEST(HfConfigReader, SupportedArchitecturesAreListedInOrder) {
  EXPECT_EQ(supported_hf_architectures(),
            (Lines{"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
                   "PhiMoEForCausalLM", "PhimoeForCausalLM", "Qwen2ForCausalLM",
                   "Qwen2MoeForCausalLM", "GPT2LMHeadModel", "GPTNeoXForCausalLM"}));
}

}  // namespace
}  // namespace dhelix
