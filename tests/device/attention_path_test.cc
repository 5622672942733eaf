// Which attention a rank runs (runtime/cuda/attention_path.h): DHELIX_ATTENTION, the
// self-check's inputs and comparison, and every branch of the decision.
#include "runtime/cuda/attention_path.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "lib/error.h"
#include "runtime/cuda/device_setup.h"

namespace dhelix::cuda {
namespace {

TEST(AttentionPath, ParsesTheEnvironmentVariable) {
  EXPECT_EQ(parse_attention_choice(nullptr), AttentionChoice::kAuto);
  EXPECT_EQ(parse_attention_choice(""), AttentionChoice::kAuto);
  EXPECT_EQ(parse_attention_choice("auto"), AttentionChoice::kAuto);
  EXPECT_EQ(parse_attention_choice("cudnn"), AttentionChoice::kCudnn);
  EXPECT_EQ(parse_attention_choice("dhelix"), AttentionChoice::kDhelix);
  try {
    parse_attention_choice("flash");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(e.what(), "DHELIX_ATTENTION=flash: expected auto, cudnn or dhelix");
  }
}

TEST(AttentionPath, SelfCheckShapeKeepsTheHeadsAndCapsTheSequence) {
  const kernels::AttentionShape job{4, 4096, 32, 8, 128};
  const kernels::AttentionShape check = self_check_shape(job);
  EXPECT_EQ(check.batch, 1);
  EXPECT_EQ(check.seq, 128);
  EXPECT_EQ(check.heads, 32);
  EXPECT_EQ(check.kv_heads, 8);
  EXPECT_EQ(check.head_dim, 128);
  EXPECT_EQ(self_check_shape({2, 64, 4, 2, 16}).seq, 64);
}

TEST(AttentionPath, SelfCheckInputsAreFixedBf16ExactAndVaried) {
  std::set<float> seen;
  for (int64_t i = 0; i < 4096; ++i) {
    const float v = self_check_input(1, i);
    ASSERT_GE(v, -1.0f);
    ASSERT_LE(v, 1.0f);
    EXPECT_EQ(v * 1024.0f, std::round(v * 1024.0f));  // 10 fraction bits: exact in bf16
    EXPECT_EQ(v, self_check_input(1, i));
    seen.insert(v);
  }
  EXPECT_GT(seen.size(), 1000u);
  EXPECT_NE(self_check_input(0, 7), self_check_input(1, 7));
}

TEST(AttentionPath, ComparisonIsRelativeToTheLargestValue) {
  const std::vector<float> dhelix{0.5f, -2.0f, 1.0f, 0.0f};
  EXPECT_EQ(compare_attention_outputs("out", dhelix, dhelix).max_error, 0.0);
  // 0.06 off at largest magnitude 2: error 0.03 <= 1/32.
  std::vector<float> close = dhelix;
  close[2] += 0.06f;
  EXPECT_TRUE(compare_attention_outputs("out", close, dhelix).agrees);
  std::vector<float> far = dhelix;
  far[3] = 0.1f;  // 0.05 of the largest value
  const OutputComparison c = compare_attention_outputs("dq", far, dhelix);
  EXPECT_FALSE(c.agrees);
  EXPECT_EQ(c.worst, 3);
  EXPECT_FLOAT_EQ(c.cudnn_value, 0.1f);
  EXPECT_FLOAT_EQ(c.dhelix_value, 0.0f);
  EXPECT_NEAR(c.max_error, 0.05, 1e-6);
  std::vector<float> nan = dhelix;
  nan[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare_attention_outputs("lse", nan, dhelix).max_error, 1.0);
  // All-zero reference: absolute errors.
  EXPECT_FALSE(compare_attention_outputs("dv", {0.1f}, {0.0f}).agrees);
}

AttentionFacts good_facts() {
  AttentionFacts facts;
  facts.built_with_cudnn = true;
  facts.cudnn_version = 91900;
  for (const char* name : {"out", "lse", "dq", "dk", "dv"}) {
    facts.outputs.push_back(compare_attention_outputs(name, {1.0f, 2.0f}, {1.0f, 2.01f}));
  }
  facts.backward_repeatable = true;
  return facts;
}

TEST(AttentionPath, CudnnWhenItIsPresentAcceptedAndAgrees) {
  AttentionSetup setup;
  const AttentionDecision d = decide_attention_path(setup, good_facts());
  EXPECT_EQ(d.path, AttentionPath::kCudnn);
  EXPECT_EQ(d.reason,
            "cuDNN 9.19.0 fused SDPA (self-check agreed with dhelix's kernel within 0.005)");
  setup.deterministic = true;
  EXPECT_EQ(decide_attention_path(setup, good_facts()).path, AttentionPath::kCudnn);
}

TEST(AttentionPath, FallsBackWhenCudnnIsAbsentOldRefusesOrDisagrees) {
  const AttentionSetup setup;
  AttentionFacts facts = good_facts();
  facts.built_with_cudnn = false;
  EXPECT_EQ(decide_attention_path(setup, facts),
            (AttentionDecision{AttentionPath::kDhelix, "dhelix's kernel (built without cuDNN)"}));
  facts = good_facts();
  facts.cudnn_version = 0;
  EXPECT_EQ(decide_attention_path(setup, facts).reason, "dhelix's kernel (libcudnn not loadable)");
  facts.cudnn_version = 80906;
  EXPECT_EQ(decide_attention_path(setup, facts).reason, "dhelix's kernel (cuDNN 8.9.6 is not 9.x)");
  facts = good_facts();
  facts.refusal = "no cuDNN engine runs the backward graph (0 offered)";
  EXPECT_EQ(decide_attention_path(setup, facts).reason,
            "dhelix's kernel (cuDNN 9.19.0 refused the graph: no cuDNN engine runs the "
            "backward graph (0 offered))");
  facts = good_facts();
  facts.outputs[2] = compare_attention_outputs("dq", {1.0f, 3.0f}, {1.0f, 2.0f});
  const AttentionDecision d = decide_attention_path(setup, facts);
  EXPECT_EQ(d.path, AttentionPath::kDhelix);
  EXPECT_EQ(d.reason,
            "dhelix's kernel (cuDNN 9.19.0: the self-check's dq differs: element 1 is 3 on "
            "cuDNN and 2 on dhelix's kernel (error 0.5 of the largest value, tolerance "
            "0.0312))");
  facts = good_facts();
  facts.outputs.clear();
  EXPECT_EQ(decide_attention_path(setup, facts).path, AttentionPath::kDhelix);
}

TEST(AttentionPath, VerifyNeedsARepeatableBackward) {
  AttentionSetup setup;
  setup.deterministic = true;
  AttentionFacts facts = good_facts();
  facts.backward_repeatable = false;
  EXPECT_EQ(decide_attention_path(setup, facts).path, AttentionPath::kDhelix);
  facts.backward_repeatable.reset();
  EXPECT_EQ(decide_attention_path(setup, facts).path, AttentionPath::kDhelix);
  setup.deterministic = false;
  EXPECT_EQ(decide_attention_path(setup, facts).path, AttentionPath::kCudnn);
}

TEST(AttentionPath, ForcingAPath) {
  AttentionSetup setup;
  setup.choice = AttentionChoice::kDhelix;
  EXPECT_FALSE(should_try_cudnn(setup, good_facts()));
  EXPECT_EQ(decide_attention_path(setup, good_facts()).path, AttentionPath::kDhelix);

  setup.choice = AttentionChoice::kCudnn;
  AttentionFacts facts = good_facts();
  facts.built_with_cudnn = false;
  EXPECT_THROW(should_try_cudnn(setup, facts), Error);
  facts = good_facts();
  facts.refusal = "no engine";
  try {
    decide_attention_path(setup, facts);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  // Forced cuDNN runs even when the self-check disagrees, and says so.
  facts = good_facts();
  facts.outputs[0] = compare_attention_outputs("out", {9.0f}, {1.0f});
  const AttentionDecision d = decide_attention_path(setup, facts);
  EXPECT_EQ(d.path, AttentionPath::kCudnn);
  EXPECT_NE(d.reason.find("although the self-check's out differs"), std::string::npos);
}

// The attention the set-up prepares (where cuDNN may serve): the rank's causal attention
// at cp 1, Ulysses' head split under a2a, none for the ring types (ring steps only).
TEST(AttentionPath, SetUpPreparesThePlainCausalAttentionOfEachCpType) {
  RankShape shape;
  shape.cp = 1;
  shape.micro_batch = 2;
  shape.seq_shard = 4096;
  shape.heads = 16;
  shape.kv_heads = 4;
  shape.head_dim = 128;
  auto setup = [&](CpCommType type) {
    return model_attention_setup(shape, /*has_layers=*/true, type, /*deterministic=*/true,
                                 AttentionChoice::kAuto);
  };
  auto expect_shape = [](const std::optional<AttentionSetup>& got, int64_t seq, int64_t heads,
                         int64_t kv_heads) {
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->shape.batch, 2);
    EXPECT_EQ(got->shape.seq, seq);
    EXPECT_EQ(got->shape.heads, heads);
    EXPECT_EQ(got->shape.kv_heads, kv_heads);
    EXPECT_EQ(got->shape.head_dim, 128);
    EXPECT_TRUE(got->deterministic);
  };
  expect_shape(setup(CpCommType::kP2p), 4096, 16, 4);  // cp 1: whatever the type
  shape.cp = 4;
  shape.seq_shard = 1024;
  expect_shape(setup(CpCommType::kA2a), 4096, 4, 1);  // the whole sequence, heads / cp
  EXPECT_FALSE(setup(CpCommType::kP2p).has_value());
  EXPECT_FALSE(setup(CpCommType::kAllGather).has_value());
  EXPECT_FALSE(setup(CpCommType::kA2aP2p).has_value());
  EXPECT_FALSE(model_attention_setup(shape, /*has_layers=*/false, CpCommType::kA2a, false,
                                     AttentionChoice::kAuto)
                   .has_value());
}

// The summary names the engine of every attention kind a rank runs, and why not cuDNN.
TEST(AttentionPath, SummaryNamesTheEngineOfEachAttentionKind) {
  const AttentionDecision refused{.path = AttentionPath::kDhelix,
                                  .reason = "dhelix kernel: cuDNN refused the graph (no engine)"};
  EXPECT_EQ(
      attention_summary(refused, 1, CpCommType::kP2p),
      std::vector<std::string>{"attention: dhelix kernel: cuDNN refused the graph (no engine)"});
  EXPECT_EQ(attention_summary(refused, 2, CpCommType::kA2a),
            std::vector<std::string>{"Ulysses head-split attention (cp_comm_type a2a): dhelix "
                                     "kernel: cuDNN refused the graph (no engine)"});
  const std::vector<std::string> ring = attention_summary(std::nullopt, 4, CpCommType::kAllGather);
  ASSERT_EQ(ring.size(), 1u);
  EXPECT_EQ(ring[0],
            "ring steps (cp_comm_type allgather): dhelix's tensor-core ring kernel; cuDNN not "
            "used: a ring step's queries and keys sit at different positions (an offset causal "
            "band), which dhelix's cuDNN graph (causal self-attention) does not express");
  EXPECT_TRUE(attention_summary(std::nullopt, 1, CpCommType::kP2p).empty());  // no layers
}

}  // namespace
}  // namespace dhelix::cuda
