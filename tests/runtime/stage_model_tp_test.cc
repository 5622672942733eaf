// Tensor parallelism does not change the model: two StageModels of a tp = 2 group, with
// and without sequence parallelism, start from slices of the tp = 1 model's weights and
// compute its loss and (gathered) gradients.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::test {
namespace {

// The element of the full tensor `name` that element i of TP rank r's shard holds; the
// layouts are those runtime/model/parameter_init.cc documents, re-derived here.
int64_t global_index(const std::string& name, int64_t i, int64_t r, int64_t tp,
                     const ModelSpec& m) {
  const int64_t h = m.hidden_size, d = m.head_dim;
  const int64_t q = m.num_attention_heads * d, kv = m.num_kv_heads * d, f = m.ffn_hidden_size;
  if (name.ends_with("w_qkv")) {
    const int64_t row = i / h, col = i % h, q_local = q / tp, kv_local = kv / tp;
    int64_t global_row = 0;
    if (row < q_local) {
      global_row = r * q_local + row;
    } else if (row < q_local + kv_local) {
      global_row = q + r * kv_local + (row - q_local);
    } else {
      global_row = q + kv + r * kv_local + (row - q_local - kv_local);
    }
    return global_row * h + col;
  }
  if (name.ends_with("w_proj")) return (i / (q / tp)) * q + r * (q / tp) + i % (q / tp);
  if (name.ends_with("w_fc1")) {
    const int64_t row = i / h, f_local = f / tp;
    const int64_t global_row = row < f_local ? r * f_local + row : f + r * f_local + row - f_local;
    return global_row * h + i % h;
  }
  if (name.ends_with("w_fc2")) return (i / (f / tp)) * f + r * (f / tp) + i % (f / tp);
  if (name == "embedding" || name == "head") return r * (m.vocab_size / tp) * h + i;
  return i;  // norm gains: whole on every rank
}

struct GroupRun {
  std::vector<float> losses;                                // per rank
  std::map<std::string, std::vector<float>> values, grads;  // full tensors
};

// Runs one micro-batch through a TP group and reassembles the full tensors. A gain whose
// gradient each rank only partly computes (SP) is summed over the ranks in rank order, as
// the trainer does; any other replicated gain must agree on every rank.
GroupRun run_group(const JobSpec& job, const rt::MicroBatchTokens& tokens) {
  TpGroup group(job, 42);
  group.start_iteration(1);
  group.set_tokens(0, tokens);
  group.forward(0);
  group.backward(0);
  GroupRun run;
  const int64_t tp = group.size();
  for (int64_t r = 0; r < tp; ++r) {
    run.losses.push_back(group.model(r).micro_batch_losses().at(0));
    for (const rt::ParameterView& p : group.model(r).parameters()) {
      const bool replicated =
          p.name.ends_with("ln_attn") || p.name.ends_with("ln_mlp") || p.name == "final_norm";
      const size_t full = static_cast<size_t>(replicated ? p.count : p.count * tp);
      std::vector<float>& values = run.values[p.name];
      std::vector<float>& grads = run.grads[p.name];
      values.resize(full, 0.0f);
      grads.resize(full, 0.0f);
      for (int64_t i = 0; i < p.count; ++i) {
        const size_t g = static_cast<size_t>(global_index(p.name, i, r, tp, job.model));
        if (r > 0 && replicated) {
          EXPECT_EQ(values[g], p.values[i]) << p.name;
          if (p.sum_gradient_over_tp) {
            grads[g] += p.gradient[i];
          } else {
            EXPECT_EQ(grads[g], p.gradient[i]) << p.name << " differs between TP ranks";
          }
          continue;
        }
        values[g] = p.values[i];
        grads[g] = p.gradient[i];
      }
    }
  }
  return run;
}

void expect_same_model(const GroupRun& tp2, const GroupRun& tp1, const char* what) {
  ASSERT_EQ(tp2.losses.size(), 2u);
  EXPECT_EQ(tp2.losses[0], tp2.losses[1]) << what << ": every TP rank computes the same loss";
  EXPECT_NEAR(tp2.losses[0], tp1.losses[0], 1e-5 * tp1.losses[0]) << what;
  ASSERT_EQ(tp2.grads.size(), tp1.grads.size()) << what;
  for (const auto& [name, want] : tp1.grads) {
    EXPECT_EQ(tp2.values.at(name), tp1.values.at(name)) << what << ": " << name;
    const std::vector<float>& got = tp2.grads.at(name);
    ASSERT_EQ(got.size(), want.size()) << what << ": " << name;
    float scale = 0.0f;
    for (float v : want) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.0f) << name;
    float worst = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    // Relative to the tensor's largest gradient: the sums run in other orders (GEMM
    // splits, reduce-scatter), so an element near zero has no relative precision.
    EXPECT_LE(worst, 1e-5f * scale) << what << ": " << name << " (largest " << scale << ")";
  }
}

TEST(StageModelTpTest, TwoRanksWithSequenceParallelismEqualOneRank) {
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 3);
  const GroupRun tp1 = run_group(tiny_job(1, false), tokens);
  expect_same_model(run_group(tiny_job(2, true), tokens), tp1, "tp 2 sp");
}

TEST(StageModelTpTest, TwoRanksWithAllReducesEqualOneRank) {
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 4);
  const GroupRun tp1 = run_group(tiny_job(1, false), tokens);
  expect_same_model(run_group(tiny_job(2, false), tokens), tp1, "tp 2 no sp");
}

TEST(StageModelTpTest, IgnoredTargetsDoNotCount) {
  rt::MicroBatchTokens tokens = random_tokens(32, 256, 5);
  const GroupRun all = run_group(tiny_job(2, true), tokens);
  tokens.targets[3] = -1;
  tokens.targets[30] = -1;
  const GroupRun some = run_group(tiny_job(2, true), tokens);
  EXPECT_NE(all.losses[0], some.losses[0]);
  const GroupRun tp1 = run_group(tiny_job(1, false), tokens);
  EXPECT_NEAR(some.losses[0], tp1.losses[0], 1e-5 * tp1.losses[0]);
}

}  // namespace
}  // namespace dhelix::test
