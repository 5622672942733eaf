#include "lib/model_spec.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

ModelSpec llama3_8b() {
  ModelSpec m;
  m.name = "llama-3-8b";
  m.hidden_size = 4096;
  m.ffn_hidden_size = 14336;
  m.num_layers = 32;
  m.num_attention_heads = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 128256;
  m.max_seq_length = 8192;
  return m;
}

ModelSpec gpt2_small() {
  ModelSpec m;
  m.norm = NormKind::kLayerNorm;
  m.activation = ActivationKind::kGelu;
  m.position = PositionKind::kLearned;
  m.hidden_size = 768;
  m.ffn_hidden_size = 3072;
  m.num_layers = 12;
  m.num_attention_heads = 12;
  m.num_kv_heads = 12;
  m.head_dim = 64;
  m.vocab_size = 50257;
  m.max_seq_length = 1024;
  m.tied_embeddings = true;
  m.linear_bias = true;
  return m;
}

ModelSpec mixtral_8x7b() {
  ModelSpec m = llama3_8b();
  m.ffn_hidden_size = 0;
  m.vocab_size = 32000;
  m.moe = MoeSpec{
      .num_experts = 8, .top_k = 2, .capacity_factor = 0.0, .expert_ffn_hidden_size = 14336};
  return m;
}

// h=4, 2 heads of 2, 1 KV head, SwiGLU FFN 8, 2 layers, vocab 10: small enough to count
// every GEMM by hand.
ModelSpec tiny() {
  ModelSpec m;
  m.hidden_size = 4;
  m.ffn_hidden_size = 8;
  m.num_layers = 2;
  m.num_attention_heads = 2;
  m.num_kv_heads = 1;
  m.head_dim = 2;
  m.vocab_size = 10;
  m.max_seq_length = 16;
  return m;
}

TEST(ModelSpecNames, EveryKindHasItsJsonName) {
  EXPECT_STREQ(norm_kind_name(NormKind::kRmsNorm), "rmsnorm");
  EXPECT_STREQ(norm_kind_name(NormKind::kLayerNorm), "layernorm");
  EXPECT_STREQ(activation_kind_name(ActivationKind::kSwiGlu), "swiglu");
  EXPECT_STREQ(activation_kind_name(ActivationKind::kGelu), "gelu");
  EXPECT_STREQ(position_kind_name(PositionKind::kRope), "rope");
  EXPECT_STREQ(position_kind_name(PositionKind::kLearned), "learned");
}

TEST(ModelSpecParameters, Llama3_8bMatchesPublishedCount) {
  // Attention 2·4096² + 2·4096·1024, SwiGLU 3·4096·14336, two RMSNorms.
  EXPECT_EQ(layer_parameter_count(llama3_8b()), 218112000);
  EXPECT_EQ(parameter_count(llama3_8b()), 8030261248);
  EXPECT_EQ(active_parameter_count(llama3_8b()), 8030261248);
}

TEST(ModelSpecParameters, Gpt2SmallMatchesPublishedCount) {
  // Tied head, 1024 learned positions, biases everywhere, LayerNorms with shift.
  EXPECT_EQ(layer_parameter_count(gpt2_small()), 7087872);
  EXPECT_EQ(parameter_count(gpt2_small()), 124439808);
}

TEST(ModelSpecParameters, Mixtral8x7bCountsAllExpertsAndActiveTopK) {
  // Layer: attention 41,943,040 + router 32,768 + 8 experts x 176,160,768 + norms 8,192.
  EXPECT_EQ(layer_parameter_count(mixtral_8x7b()), 1451270144);
  EXPECT_EQ(parameter_count(mixtral_8x7b()), 46702792704);
  EXPECT_EQ(active_parameter_count(mixtral_8x7b()), 12879925248);
}

TEST(ModelSpecParameters, UntyingTheHeadAddsOneEmbedding) {
  ModelSpec untied = gpt2_small();
  untied.tied_embeddings = false;
  EXPECT_EQ(parameter_count(untied) - parameter_count(gpt2_small()), 50257 * 768);
}

TEST(ModelSpecFlops, MegatronFormulaMatchesHandCount) {
  // Per token forward: 2 x GEMM parameters (per layer Q 16, K 8, V 8, O 16, MLP 96; head 40)
  // = 2 x 328 = 656, plus attention 4·s·q = 96 per layer = 192: 848. Training 3x = 2544;
  // 3 sequences of 6 tokens = 45,792. Formula: 12·3·6·2·16·(3 + 3 + 0.625) = 45,792.
  EXPECT_DOUBLE_EQ(training_flops_per_iteration(tiny(), 3, 6), 45792.0);
  EXPECT_DOUBLE_EQ(training_flops_per_token(tiny(), 6), 2544.0);
}

TEST(ModelSpecFlops, GeluMlpHasTwoMatricesNotThree) {
  ModelSpec gelu = tiny();
  gelu.activation = ActivationKind::kGelu;
  // MLP term (f/h)·1 = 2 instead of 3: 6912 x (3 + 2 + 0.625) = 38,880.
  EXPECT_DOUBLE_EQ(training_flops_per_iteration(gelu, 3, 6), 38880.0);
}

TEST(ModelSpecFlops, MoeCountsTopKExperts) {
  ModelSpec moe = tiny();
  moe.moe =
      MoeSpec{.num_experts = 4, .top_k = 2, .capacity_factor = 0, .expert_ffn_hidden_size = 8};
  // MLP term (8/4)·2·1.5 = 6: 6912 x (3 + 6 + 0.625) = 66,528.
  EXPECT_DOUBLE_EQ(training_flops_per_iteration(moe, 3, 6), 66528.0);
}

TEST(ModelSpecFlops, Llama3_8bPerTokenAtSequence8192) {
  // 12·8192·32·4096²·[(1 + 0.25 + 2)·1 + 3.5·1.5 + 128256/262144] / 8192 tokens.
  const double expected =
      12.0 * 32 * 4096.0 * 4096.0 * (3.25 + 5.25 + 128256.0 / (2.0 * 32 * 4096));
  EXPECT_DOUBLE_EQ(training_flops_per_token(llama3_8b(), 8192), expected);
  EXPECT_NEAR(training_flops_per_token(llama3_8b(), 8192) / 1e9, 57.91, 0.01);
}

}  // namespace
}  // namespace dhelix
