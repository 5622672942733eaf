// Context parallelism executed (runtime/model/layer_ops_cp.h): the shipped tiny-cp2-tp2
// plan (tp 2 x cp 2, 4 ranks) run by the plan interpreter on threads of this process
// (LoopbackWorld), against itself (co-executed = sequential, bitwise, with jitter) and
// against tiny-tp2 (cp 1, the same model, seed and tokens): the losses and the gradients
// summed over the CP group agree within the tolerance docs/kernels.md states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "runtime/comm/loopback_communicator.h"
#include "runtime/exec/interpreter.h"
#include "runtime/train/context_split.h"
#include "tests/runtime/loopback_directory.h"
#include "tests/runtime/loopback_ranks.h"
#include "tests/runtime/shipped_plan.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

struct RankResult {
  std::vector<float> losses;  // per micro-batch; NaN where this rank has no loss
  std::vector<std::vector<float>> gradients;
  std::string error;
};

// The micro-batch's whole sequences, the same for every job of these tests.
MicroBatchTokens full_tokens(const JobSpec& job, int64_t mb) {
  return test::random_tokens(job.parallel.micro_batch_size * job.parallel.seq_length,
                             job.model.vocab_size, static_cast<uint32_t>(300 + mb));
}

RankResult run_rank(const PlannedJob& p, LoopbackWorld& world, const Placement& placement,
                    int64_t rank, ExecutionMode mode, int64_t jitter_us, const std::string& name) {
  const RankProgram program = lower_rank_program(p.plan, p.job, rank, mode);
  const PlanStage& stage = p.plan.stages.at(static_cast<size_t>(program.stage));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
    if (range.count > 0) ranges.emplace_back(range.first, range.count);
  }
  StageModel model(p.job, rank, ranges, stage.embedding, stage.head_loss, 11);
  const ParallelSpec& par = p.job.parallel;
  model.start_iteration(p.plan.num_micro_batches);
  // The loss scale of the global mean over the whole sequences, as the trainer sets it.
  model.set_loss_scale(
      1.0f / static_cast<float>(p.plan.num_micro_batches * par.micro_batch_size * par.seq_length));
  for (int64_t mb = 0; mb < p.plan.num_micro_batches; ++mb) {
    MicroBatchTokens tokens = full_tokens(p.job, mb);
    if (par.cp > 1) {
      tokens = context_parallel_share(tokens, par.micro_batch_size, par.seq_length, par.cp,
                                      placement.coordinates(rank).cp);
    }
    model.set_tokens(mb, std::move(tokens));
  }
  LoopbackDirectory comms(world, placement, rank, name);
  execute_program(p.plan, program, model, comms,
                  {.jitter_us = jitter_us, .jitter_seed = 9, .on_failure = {}});
  RankResult result;
  result.losses = model.micro_batch_losses();
  for (const ParameterView& view : model.parameters()) {
    result.gradients.emplace_back(view.gradient, view.gradient + view.count);
  }
  return result;
}

std::vector<RankResult> run(const PlannedJob& p, ExecutionMode mode, int64_t jitter_us,
                            const std::string& name) {
  const Placement placement(p.job.parallel, p.job.cluster.gpus_per_node);
  const std::vector<RankResult> results = testing::run_loopback_ranks<RankResult>(
      placement.world_size(), [&](LoopbackWorld& world, int64_t rank) {
        return run_rank(p, world, placement, rank, mode, jitter_us, name);
      });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r].error, "") << "rank " << r;
  return results;
}

// runtime/train/context_split.h's worked example, two sequences.
TEST(ContextSplit, EachCpRankKeepsChunksRAndItsMirrorWithTheirTargets) {
  MicroBatchTokens full;
  for (int32_t t = 0; t < 16; ++t) {
    full.tokens.push_back(t);
    full.targets.push_back(100 + t);
  }
  const MicroBatchTokens early = context_parallel_share(full, 2, 8, 2, 0);
  const MicroBatchTokens late = context_parallel_share(full, 2, 8, 2, 1);
  EXPECT_EQ(early.tokens, (std::vector<int32_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(early.targets, (std::vector<int32_t>{100, 101, 106, 107, 108, 109, 114, 115}));
  EXPECT_EQ(late.tokens, (std::vector<int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(context_parallel_share(full, 2, 8, 1, 0).tokens, full.tokens);
}

TEST(CpInterpreter, CoExecutedEqualsSequentialBitwiseUnderJitter) {
  const PlannedJob cp2 = shipped("tiny-cp2-tp2");
  ASSERT_EQ(cp2.job.parallel.cp, 2);
  const std::vector<RankResult> sequential = run(cp2, ExecutionMode::kSequential, 0, "seq/");
  const std::vector<RankResult> co_executed = run(cp2, ExecutionMode::kCoExecuted, 150, "co/");
  ASSERT_EQ(sequential.size(), 4u);
  for (size_t r = 0; r < sequential.size(); ++r) {
    EXPECT_EQ(sequential[r].gradients, co_executed[r].gradients) << "rank " << r;
    ASSERT_EQ(sequential[r].losses.size(), co_executed[r].losses.size());
    for (size_t mb = 0; mb < sequential[r].losses.size(); ++mb) {
      EXPECT_EQ(std::bit_cast<uint32_t>(sequential[r].losses[mb]),
                std::bit_cast<uint32_t>(co_executed[r].losses[mb]))
          << "rank " << r << " micro-batch " << mb;
    }
  }
}

// docs/kernels.md ("Context parallelism, executed"): the whole model's losses within
// kLossTolerance relative, gradients |cp2 - cp1| <= kGradientTolerance (max |cp1| of the
// tensor) element by element.
constexpr float kLossTolerance = 1e-5f;
constexpr float kGradientTolerance = 1e-5f;

TEST(CpInterpreter, CpTwoEqualsCpOneWithinTheStatedTolerance) {
  const PlannedJob cp1 = shipped("tiny-tp2");
  const PlannedJob cp2 = shipped("tiny-cp2-tp2");
  ASSERT_EQ(cp1.plan.num_micro_batches, cp2.plan.num_micro_batches);
  const std::vector<RankResult> one = run(cp1, ExecutionMode::kSequential, 0, "cp1/");
  const std::vector<RankResult> two = run(cp2, ExecutionMode::kCoExecuted, 0, "cp2/");
  const Placement placement(cp2.job.parallel, cp2.job.cluster.gpus_per_node);
  for (int64_t tp = 0; tp < 2; ++tp) {
    const RankResult& reference = one[static_cast<size_t>(tp)];
    const RankResult& early = two[static_cast<size_t>(placement.rank_of({.tp = tp, .cp = 0}))];
    const RankResult& late = two[static_cast<size_t>(placement.rank_of({.tp = tp, .cp = 1}))];
    // Each CP rank's loss is the mean over its half of the tokens.
    for (size_t mb = 0; mb < reference.losses.size(); ++mb) {
      const float mean = (early.losses[mb] + late.losses[mb]) / 2;
      EXPECT_NEAR(mean, reference.losses[mb], kLossTolerance * std::abs(reference.losses[mb]))
          << "tp " << tp << " micro-batch " << mb;
    }
    // Gradients: the sum over the CP group (the DP x CP reduction) against cp 1.
    ASSERT_EQ(reference.gradients.size(), early.gradients.size());
    for (size_t t = 0; t < reference.gradients.size(); ++t) {
      const std::vector<float>& want = reference.gradients[t];
      ASSERT_EQ(want.size(), early.gradients[t].size());
      float largest = 0, worst = 0;
      for (float g : want) largest = std::max(largest, std::abs(g));
      ASSERT_GT(largest, 0.0f) << "tensor " << t << " has no gradient";
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(early.gradients[t][i] + late.gradients[t][i] - want[i]));
      }
      EXPECT_LE(worst, kGradientTolerance * largest) << "tp " << tp << " tensor " << t;
    }
  }
}

}  // namespace
}  // namespace dhelix::rt
