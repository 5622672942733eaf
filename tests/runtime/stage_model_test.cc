// StageModel on one rank (tp = 1, the whole model): the loss of a fresh model, gradients
// against finite differences, gradient accumulation, and bind errors.

#include "runtime/model/stage_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "lib/error.h"
#include "runtime/model/stage_model_internal.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::test {
namespace {

using rt::OpRef;
using rt::ParameterView;

std::map<std::string, std::vector<float>> gradients_of(rt::StageModel& model) {
  std::map<std::string, std::vector<float>> out;
  for (const ParameterView& p : model.parameters()) {
    out[p.name].assign(p.gradient, p.gradient + p.count);
  }
  return out;
}

// Element ranges of a tensor checked separately: each part of a fused weight.
std::vector<std::pair<int64_t, int64_t>> parts_of(const ParameterView& p, const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  if (p.name.ends_with("w_qkv")) {
    const int64_t q = m.num_attention_heads * m.head_dim * h, kv = m.num_kv_heads * m.head_dim * h;
    return {{0, q}, {q, q + kv}, {q + kv, q + 2 * kv}};
  }
  if (p.name.ends_with("w_fc1")) return {{0, p.count / 2}, {p.count / 2, p.count}};
  return {{0, p.count}};
}

TEST(StageModelTest, FreshLossIsNearUniformAndGradientsMatchFiniteDifferences) {
  const JobSpec job = tiny_job(1, false);
  TpGroup group(job, 7);
  rt::StageModel& model = group.model(0);
  group.start_iteration(1);
  group.set_tokens(0, random_tokens(32, 256, 11));
  group.forward(0);
  group.backward(0);
  const float loss = model.micro_batch_losses().at(0);
  // Logits of a fresh model have a standard deviation of about 0.6: the loss is ln(256)
  // plus about half their variance.
  EXPECT_NEAR(loss, std::log(256.0), 0.4);

  auto forward_loss = [&] {
    group.forward(0);
    return static_cast<double>(model.micro_batch_losses().at(0));
  };
  int64_t checked = 0;
  for (const ParameterView& p : model.parameters()) {
    for (const auto& [begin, end] : parts_of(p, job.model)) {
      // The part's largest gradient: there the fp32 loss's rounding matters least.
      int64_t best = begin;
      for (int64_t i = begin; i < end; ++i) {
        if (std::abs(p.gradient[i]) > std::abs(p.gradient[best])) best = i;
      }
      const float original = p.values[best];
      const float step = 1e-2f;
      p.values[best] = original + step;
      const double plus = forward_loss();
      p.values[best] = original - step;
      const double minus = forward_loss();
      p.values[best] = original;
      const double numeric = (plus - minus) / (2.0 * step);
      EXPECT_GT(std::abs(p.gradient[best]), 1e-4) << p.name;
      EXPECT_NEAR(p.gradient[best], numeric, 2e-2 * std::abs(numeric))
          << p.name << " element " << best;
      ++checked;
    }
  }
  // 2 layers x (2 gains + qkv 3 parts + proj + fc1 2 parts + fc2) + embedding, norm, head.
  EXPECT_EQ(checked, 2 * 9 + 3);
}

// The model file's norm_eps and rope_base reach the kernels: each changes the loss of the
// same weights and tokens, and the defaults equal the values Llama 2 uses.
TEST(StageModelTest, NormEpsAndRopeBaseOfTheModelAreUsed) {
  auto loss_of = [](const JobSpec& job) {
    TpGroup group(job, 7);
    group.start_iteration(1);
    group.set_tokens(0, random_tokens(32, 256, 11));
    group.forward(0);
    return group.model(0).micro_batch_losses().at(0);
  };
  JobSpec job = tiny_job(1, false);
  const float by_default = loss_of(job);
  job.model.norm_eps = 1e-5;
  job.model.rope_base = 10000.0;
  EXPECT_EQ(loss_of(job), by_default);
  job.model.rope_base = 500000.0;
  EXPECT_NE(loss_of(job), by_default);
  job.model.rope_base.reset();
  job.model.norm_eps = 0.5;  // large enough to move fp32 outputs of unit-scale inputs
  EXPECT_NE(loss_of(job), by_default);
}

// Activation recompute: the backward reads only recomputed activations, which equal the
// stored ones bit for bit, so the gradients equal those of a storing run; without the
// repeated forward ops the backward reads buffers no forward wrote and they differ.
TEST(StageModelTest, RecomputeGivesTheStoringRunsGradientsBitForBit) {
  for (const bool sp : {false, true}) {
    auto gradients = [sp](RecomputeGranularity granularity, bool skip_repeats) {
      JobSpec job = tiny_job(2, sp);
      job.parallel.recompute.granularity = granularity;
      TpGroup group(job, 7);
      group.start_iteration(1);
      group.set_tokens(0, random_tokens(32, 256, 11));
      group.forward(0);
      group.backward(0, skip_repeats ? "bwd.recompute." : "");
      std::vector<std::map<std::string, std::vector<float>>> all;
      for (int64_t r = 0; r < group.size(); ++r) all.push_back(gradients_of(group.model(r)));
      return all;
    };
    const auto stored = gradients(RecomputeGranularity::kNone, false);
    for (const RecomputeGranularity g :
         {RecomputeGranularity::kFull, RecomputeGranularity::kSelective}) {
      SCOPED_TRACE(std::string(recompute_granularity_name(g)) + (sp ? " with SP" : ""));
      EXPECT_EQ(gradients(g, false), stored);
      EXPECT_NE(gradients(g, true), stored);
    }
  }
}

TEST(StageModelTest, EveryOpOfEveryVariantBinds) {
  for (const auto& [tp, sp] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    TpGroup group(tiny_job(tp, sp), 1);
    for (const std::string& id : group.op_ids()) {
      const bool extra =
          id.find("embedding") != std::string::npos || id.find("head") != std::string::npos ||
          id.find("loss") != std::string::npos || id.find("final_norm") != std::string::npos;
      rt::BoundOp bound = group.model(0).bind(OpRef{id, extra ? -1 : 1, 3});
      EXPECT_NE(static_cast<bool>(bound.compute), bound.collective.has_value()) << id;
    }
  }
}

TEST(StageModelTest, CollectivesHaveTheDocumentedShapes) {
  TpGroup sp_group(tiny_job(2, true), 1);
  rt::StageModel& m = sp_group.model(1);
  rt::BoundOp gather = m.bind(OpRef{"fwd.allgather_attn", 0, 0});
  ASSERT_TRUE(gather.collective.has_value());
  EXPECT_EQ(gather.collective->kind, rt::CollectiveKind::kAllGather);
  EXPECT_EQ(gather.collective->count, 16 * 64);  // T/tp rows x hidden
  rt::BoundOp scatter = m.bind(OpRef{"bwd.reduce_scatter_head", -1, 0});
  EXPECT_EQ(scatter.collective->kind, rt::CollectiveKind::kReduceScatter);
  EXPECT_EQ(scatter.collective->count, 16 * 64);
  rt::BoundOp loss = m.bind(OpRef{"fwd.allreduce_loss", -1, 0});
  EXPECT_EQ(loss.collective->kind, rt::CollectiveKind::kAllGather);
  EXPECT_EQ(loss.collective->count, 3 * 32);
  EXPECT_EQ(m.boundary_elements(), 16 * 64);
  // The embedding's reduction writes the first layer's input.
  rt::BoundOp embed = m.bind(OpRef{"fwd.reduce_scatter_embedding", -1, 0});
  EXPECT_EQ(embed.collective->out, m.residual(0, 0));

  TpGroup ar_group(tiny_job(2, false), 1);
  rt::BoundOp reduce = ar_group.model(0).bind(OpRef{"bwd.allreduce_mlp", 1, 0});
  EXPECT_EQ(reduce.collective->kind, rt::CollectiveKind::kAllReduce);
  EXPECT_EQ(reduce.collective->count, 32 * 64);  // all T rows
  EXPECT_EQ(ar_group.model(0).boundary_elements(), 32 * 64);
}

TEST(StageModelTest, GradientsAccumulateOverMicroBatches) {
  const JobSpec job = tiny_job(1, false);
  const rt::MicroBatchTokens first = random_tokens(32, 256, 21),
                             second = random_tokens(32, 256, 22);
  TpGroup both(job, 5);
  both.start_iteration(2);
  both.set_tokens(0, first);
  both.set_tokens(1, second);
  // Interleaved as a pipeline would: each micro-batch must keep its own activations.
  both.forward(0);
  both.forward(1);
  both.backward(1);
  both.backward(0);
  TpGroup single(job, 5);
  std::map<std::string, std::vector<float>> expected;
  std::vector<float> losses;
  for (const rt::MicroBatchTokens* tokens : {&first, &second}) {
    single.start_iteration(1);
    single.set_tokens(0, *tokens);
    single.forward(0);
    single.backward(0);
    losses.push_back(single.model(0).micro_batch_losses().at(0));
    for (auto& [name, g] : gradients_of(single.model(0))) {
      std::vector<float>& sum = expected[name];
      sum.resize(g.size(), 0.0f);
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  }
  EXPECT_EQ(both.model(0).micro_batch_losses(), losses);
  for (const auto& [name, g] : gradients_of(both.model(0))) {
    const std::vector<float>& want = expected.at(name);
    float scale = 0.0f;
    for (float v : want) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.0f) << name;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(g[i], want[i], 1e-6f * scale) << name << " element " << i;
    }
  }
  // start_iteration zeroes every gradient and forgets the losses.
  both.start_iteration(2);
  for (const ParameterView& p : both.model(0).parameters()) {
    EXPECT_TRUE(std::all_of(p.gradient, p.gradient + p.count, [](float v) { return v == 0.0f; }))
        << p.name;
  }
  EXPECT_TRUE(std::isnan(both.model(0).micro_batch_losses().at(1)));
}

TEST(StageModelTest, PipelineStagesExchangeTheResidualBuffers) {
  // Two stages of one layer each compute what the whole model computes, when the test
  // moves residual(mb, 1) forward and residual_grad(mb, 0) backward as the pipeline does.
  JobSpec job = tiny_job(2, true);
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 8);
  TpGroup whole(job, 9);
  whole.start_iteration(1);
  whole.set_tokens(0, tokens);
  whole.forward(0);
  whole.backward(0);
  job.parallel.pp = 2;
  TpGroup first(job, 9, 0, 0, 1, true, false), last(job, 9, 1, 1, 1, false, true);
  for (TpGroup* stage : {&first, &last}) {
    stage->start_iteration(1);
    stage->set_tokens(0, tokens);
  }
  auto copy = [](const float* from, float* to, int64_t count) { std::copy_n(from, count, to); };
  const int64_t count = first.model(0).boundary_elements();
  first.forward(0);
  for (int64_t r = 0; r < 2; ++r)
    copy(first.model(r).residual(0, 1), last.model(r).residual(0, 1), count);
  last.forward(0);
  last.backward(0);
  for (int64_t r = 0; r < 2; ++r) {
    copy(last.model(r).residual_grad(0, 0), first.model(r).residual_grad(0, 0), count);
  }
  first.backward(0);
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(last.model(r).micro_batch_losses(), whole.model(r).micro_batch_losses());
    EXPECT_TRUE(std::isnan(first.model(r).micro_batch_losses().at(0)));  // no loss there
    std::map<std::string, std::vector<float>> staged = gradients_of(first.model(r));
    staged.merge(gradients_of(last.model(r)));
    EXPECT_EQ(staged, gradients_of(whole.model(r))) << "rank " << r;
  }
}

TEST(StageModelTest, ParametersAreListedInOrder) {
  TpGroup group(tiny_job(2, true), 1);
  std::vector<std::string> names;
  std::vector<int64_t> counts;
  for (const ParameterView& p : group.model(1).parameters()) {
    names.push_back(p.name);
    counts.push_back(p.count);
    EXPECT_EQ(p.sum_gradient_over_tp,
              p.name.ends_with("ln_attn") || p.name.ends_with("ln_mlp") || p.name == "final_norm")
        << p.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.ln_attn", "layers.0.w_qkv",
                                             "layers.0.w_proj", "layers.0.ln_mlp", "layers.0.w_fc1",
                                             "layers.0.w_fc2", "layers.1.ln_attn", "layers.1.w_qkv",
                                             "layers.1.w_proj", "layers.1.ln_mlp", "layers.1.w_fc1",
                                             "layers.1.w_fc2", "embedding", "final_norm", "head"}));
  // qkv: (2 q heads + 2 x 1 kv head) x 16 rows of 64; fc1: 2 x 64 rows; vocab 128 rows.
  EXPECT_EQ(counts, (std::vector<int64_t>{64, 64 * 64, 64 * 32, 64, 128 * 64, 64 * 64, 64, 64 * 64,
                                          64 * 32, 64, 128 * 64, 64 * 64, 128 * 64, 64, 128 * 64}));
}

template <class F>
std::string error_of(F&& f, ErrorCode want) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(StageModelTest, BindRejectsUnknownOpsAndLayersItDoesNotHold) {
  const JobSpec job = tiny_job(2, true);
  rt::StageModel model(job, 1, {{1, 1}}, false, false, 3);
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"fwd.bogus", 1, 0});
                },
                ErrorCode::kUnsupported),
            "StageModel: op fwd.bogus is not implemented by the runtime's model");
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"fwd.router", -1, 0});
                },
                ErrorCode::kUnsupported),
            "StageModel: op fwd.router is not implemented by the runtime's model");
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"fwd.ln_attn", 0, 0});
                },
                ErrorCode::kInvalidInput),
            "StageModel: rank 1 does not hold layer 0 (op fwd.ln_attn)");
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"fwd.embedding", -1, 0});
                },
                ErrorCode::kInvalidInput),
            "StageModel: rank 1 does not hold the embedding (op fwd.embedding)");
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"bwd.loss", -1, 0});
                },
                ErrorCode::kInvalidInput),
            "StageModel: rank 1 does not hold the head (op bwd.loss)");
  EXPECT_EQ(error_of(
                [&] {
                  model.bind(OpRef{"fwd.allreduce_attn", 1, 0});
                },
                ErrorCode::kInvalidInput),
            "StageModel: op fwd.allreduce_attn does not occur in a layer with tp = 2 with sequence "
            "parallelism");
  EXPECT_EQ(
      error_of([&] { model.set_tokens(0, random_tokens(31, 256, 1)); }, ErrorCode::kInvalidInput),
      "StageModel: micro-batch 0 has 31 tokens and 31 targets; micro_batch_size x "
      "seq_length = 32");
  rt::MicroBatchTokens bad = random_tokens(32, 256, 1);
  bad.tokens[5] = 256;
  EXPECT_EQ(error_of([&] { model.set_tokens(0, bad); }, ErrorCode::kInvalidInput),
            "StageModel: micro-batch 0 position 5: token 256 / target " +
                std::to_string(bad.targets[5]) + " outside the vocabulary of 256");
}

TEST(StageModelTest, RejectsSettingsTheRuntimeDoesNotRun) {
  JobSpec job = tiny_job(2, true);
  job.model.norm = NormKind::kLayerNorm;
  job.model.activation = ActivationKind::kGelu;
  job.model.position = PositionKind::kLearned;
  job.model.linear_bias = true;
  job.model.tied_embeddings = true;
  job.model.moe = MoeSpec{4, 2, 0.0, 128, 63};  // tp = 2 does not divide the shared 63
  job.model.ffn_hidden_size = 129;
  job.model.head_dim = 15;
  job.parallel.cp = 2;
  job.parallel.seq_length = 18;  // not 2 x cp chunks
  job.parallel.ep = 2;
  const std::string yet = " is not run by the runtime yet";
  EXPECT_EQ(error_of(
                [&] {
                  rt::StageModel model(job, 0, {{0, 2}}, true, true, 1);
                },
                ErrorCode::kUnsupported),
            "model.json: /moe/shared_expert_ffn_hidden_size: 63" + yet +
                " with tp = 2 (tp must divide it)\n" + "model.json: /norm: layernorm" + yet +
                " (rmsnorm only)\n" + "model.json: /activation: gelu" + yet + " (swiglu only)\n" +
                "model.json: /position: learned" + yet + " (rope only)\n" +
                "model.json: /linear_bias: true" + yet + " (no biases only)\n" +
                "model.json: /tied_embeddings: true" + yet + " (untied embeddings only)\n" +
                "model.json: /ffn_hidden_size: 129" + yet + " with tp = 2 (tp must divide it)\n" +
                "model.json: /head_dim: 15" + yet + " (RoPE needs it even)\n" +
                "job.json: /parallel/seq_length: 18 is not a multiple of 2 x cp = 4: context "
                "parallelism gives each CP rank two chunks of every sequence");
  // A backend without MoE layers (CUDA) refuses the model itself, and ep with it.
  const std::string refusal = error_of(
      [&] { rt::model_detail::check_supported(job, /*runs_moe=*/false); }, ErrorCode::kUnsupported);
  EXPECT_NE(refusal.find("model.json: /moe: mixture-of-experts" + yet +
                         " on this backend (the CPU and CUDA backends only)\n"),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("job.json: /parallel/ep: 2" + yet + " (1 only)"), std::string::npos)
      << refusal;
}

}  // namespace
}  // namespace dhelix::test
