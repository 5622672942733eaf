// The plan interpreter (runtime/exec/interpreter.h) without mpirun: the four ranks of the
// tiny TP2 x PP2 plan as threads of this process, communicating through LoopbackWorld
// (runtime/comm/loopback_communicator.h). The co-executed program must give the same bits
// as the sequential one (dhelix-run --verify's rule), with and without jitter.
#include "runtime/exec/interpreter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "runtime/comm/loopback_communicator.h"
#include "tests/runtime/loopback_directory.h"
#include "tests/runtime/loopback_ranks.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

struct RankResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> gradients;
  std::string error;
};

class InterpreterLoopback : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json";
    plan_ = read_plan(path);
    job_ = job_from_plan(plan_, "tiny-tp2-pp2");
  }

  // Every rank's losses and gradients after one iteration of `mode`.
  std::vector<RankResult> run(ExecutionMode mode, int64_t jitter_us, const std::string& name) {
    const Placement placement(job_.parallel, job_.cluster.gpus_per_node);
    return testing::run_loopback_ranks<RankResult>(
        placement.world_size(), [&](LoopbackWorld& world, int64_t rank) {
          return run_rank(world, placement, rank, mode, jitter_us, name);
        });
  }

  RankResult run_rank(LoopbackWorld& world, const Placement& placement, int64_t rank,
                      ExecutionMode mode, int64_t jitter_us, const std::string& name) {
    const RankProgram program = lower_rank_program(plan_, job_, rank, mode);
    const PlanStage* stage = nullptr;
    for (const PlanStage& s : plan_.stages) {
      if (s.stage == program.stage) stage = &s;
    }
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const PlanLayerRange& range : {stage->down_layers, stage->up_layers}) {
      if (range.count > 0) ranges.emplace_back(range.first, range.count);
    }
    StageModel model(job_, rank, ranges, stage->embedding, stage->head_loss, 11);
    int64_t micro_batches = 0;
    for (const Instruction& i : program.instructions) {
      micro_batches = std::max(micro_batches, i.micro_batch + 1);
    }
    model.start_iteration(micro_batches);
    const int64_t tokens = job_.parallel.micro_batch_size * job_.parallel.seq_length;
    for (int64_t mb = 0; mb < micro_batches; ++mb) {
      model.set_tokens(
          mb, test::random_tokens(tokens, job_.model.vocab_size, static_cast<uint32_t>(100 + mb)));
    }
    LoopbackDirectory comms(world, placement, rank, name);
    execute_program(plan_, program, model, comms,
                    {.jitter_us = jitter_us, .jitter_seed = 5, .on_failure = {}});
    RankResult result;
    result.losses = model.micro_batch_losses();
    for (const ParameterView& p : model.parameters()) {
      result.gradients.emplace_back(p.gradient, p.gradient + p.count);
    }
    return result;
  }

  Plan plan_;
  JobSpec job_;
};

void expect_bitwise_equal(const std::vector<RankResult>& a, const std::vector<RankResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].error, "") << "rank " << r;
    ASSERT_EQ(b[r].error, "") << "rank " << r;
    ASSERT_EQ(a[r].gradients.size(), b[r].gradients.size());
    for (size_t p = 0; p < a[r].gradients.size(); ++p) {
      EXPECT_EQ(a[r].gradients[p], b[r].gradients[p]) << "rank " << r << ", parameter " << p;
    }
    ASSERT_EQ(a[r].losses.size(), b[r].losses.size());
    for (size_t m = 0; m < a[r].losses.size(); ++m) {
      // NaN where this rank computes no loss: compare the bits.
      EXPECT_EQ(std::isnan(a[r].losses[m]), std::isnan(b[r].losses[m]));
      if (!std::isnan(a[r].losses[m])) {
        EXPECT_EQ(a[r].losses[m], b[r].losses[m]);
      }
    }
  }
}

TEST_F(InterpreterLoopback, CoExecutedEqualsSequentialBitwiseOnFourThreadRanks) {
  const auto sequential = run(ExecutionMode::kSequential, 0, "seq/");
  const auto co_executed = run(ExecutionMode::kCoExecuted, 0, "co/");
  expect_bitwise_equal(sequential, co_executed);
  // The last stage computed losses, and they are finite.
  bool any_loss = false;
  for (const RankResult& r : sequential) {
    for (float loss : r.losses) any_loss |= std::isfinite(loss);
  }
  EXPECT_TRUE(any_loss);
}

TEST_F(InterpreterLoopback, JitterChangesNothing) {
  const auto plain = run(ExecutionMode::kCoExecuted, 0, "plain/");
  const auto shaken = run(ExecutionMode::kCoExecuted, 200, "shaken/");
  expect_bitwise_equal(plain, shaken);
}

}  // namespace
}  // namespace dhelix::rt
