// FSDP's ops through the plan interpreter (runtime/exec/interpreter.h) on the loopback
// communicator: the four DP ranks of tiny-fsdp-dp4's plan (the planner's golden plan of
// examples/jobs/tiny-fsdp-dp4.json) as threads of this process. The gathers and
// reduce-scatters run on the DP group's communicators of their streams; the co-executed
// program under jitter gives the bits of the sequential one (dhelix-run --verify's rule),
// and every replica ends with the same extras' gradients and its own shard's.
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
#include "runtime/exec/stream_lowering.h"
#include "runtime/memory/memory_report.h"
#include "tests/planner/model_plan.h"
#include "tests/runtime/loopback_directory.h"
#include "tests/runtime/loopback_ranks.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

struct RankResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> gradients;
  std::vector<std::string> names;
  std::string error;
};

class FsdpInterpreter : public ::testing::Test {
 protected:
  void SetUp() override {
    plan_ =
        read_plan(std::string(DHELIX_SOURCE_DIR) + "/tests/golden/outputs/tiny-fsdp-dp4/plan.json");
    job_ = job_from_plan(plan_, "tiny-fsdp-dp4");
    ASSERT_TRUE(plan_.options.fsdp.has_value());
  }

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
    const FsdpSettings fsdp{.enabled = true,
                            .reshard_after_forward = plan_.options.fsdp->reshard_after_forward};
    StageModel model(job_, rank, {{0, job_.model.num_layers}}, true, true, 11, {}, fsdp);
    model.plan_activation_memory({&program}, program_orders({&program}));
    int64_t micro_batches = 0;
    for (const Instruction& i : program.instructions) {
      micro_batches = std::max(micro_batches, i.micro_batch + 1);
    }
    const int64_t tokens = job_.parallel.micro_batch_size * job_.parallel.seq_length;
    RankResult result;
    LoopbackDirectory comms(world, placement, rank, name);
    // Two iterations: the second reuses the arena's memory the first released.
    for (int64_t iteration = 0; iteration < 2; ++iteration) {
      model.start_iteration(micro_batches);
      for (int64_t mb = 0; mb < micro_batches; ++mb) {
        model.set_tokens(mb, test::random_tokens(tokens, job_.model.vocab_size,
                                                 static_cast<uint32_t>(100 * rank + mb)));
      }
      execute_program(plan_, program, model, comms,
                      {.jitter_us = jitter_us, .jitter_seed = 5, .on_failure = {}});
      model.finish_iteration();
    }
    result.losses = model.micro_batch_losses();
    for (const ParameterView& p : model.parameters()) {
      result.names.push_back(p.name);
      result.gradients.emplace_back(p.gradient, p.gradient + p.count);
    }
    return result;
  }

  Plan plan_;
  JobSpec job_;
};

TEST_F(FsdpInterpreter, CoExecutedUnderJitterEqualsSequentialBitwise) {
  const auto sequential = run(ExecutionMode::kSequential, 0, "seq/");
  const auto co_executed = run(ExecutionMode::kCoExecuted, 300, "co/");
  ASSERT_EQ(sequential.size(), 4U);
  for (size_t r = 0; r < sequential.size(); ++r) {
    ASSERT_EQ(sequential[r].error, "") << "rank " << r;
    ASSERT_EQ(co_executed[r].error, "") << "rank " << r;
    EXPECT_EQ(sequential[r].gradients, co_executed[r].gradients) << "rank " << r;
    ASSERT_EQ(sequential[r].losses.size(), co_executed[r].losses.size());
    for (size_t m = 0; m < sequential[r].losses.size(); ++m) {
      EXPECT_TRUE(std::isfinite(sequential[r].losses[m]));
      EXPECT_EQ(sequential[r].losses[m], co_executed[r].losses[m]);
    }
    // The layers are shards (one view per layer), the extras whole.
    int64_t shards = 0;
    for (const std::string& n : sequential[r].names) shards += n.ends_with(".fsdp_shard");
    EXPECT_EQ(shards, job_.model.num_layers);
  }
  // The shards' gradients are each rank's own part of one sum: finite, not all zero, and
  // different across ranks (rank 0 and 1 hold different elements).
  const std::vector<float>& g0 = sequential[0].gradients[0];
  const std::vector<float>& g1 = sequential[1].gradients[0];
  EXPECT_NE(g0, g1);
  bool nonzero = false;
  for (float v : g0) {
    ASSERT_TRUE(std::isfinite(v));
    nonzero |= v != 0.0f;
  }
  EXPECT_TRUE(nonzero);
}

// The gathered weights the arena holds at once, in layers, against what the planner's memory
// model counts for them (planner/memory_model.h, FsdpMemory: 2·strands·P, each strand's
// layer running and its next one prefetched; tiny-fsdp-dp4 folds into the W, two strands:
// four layers). The lowering gathers per strand (lib/plan/rank_program.h).
int64_t gathered_peak_layers(const Plan& plan, const JobSpec& job) {
  const RankProgram program = lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted);
  const FsdpSettings fsdp{.enabled = true,
                          .reshard_after_forward = plan.options.fsdp->reshard_after_forward};
  StageModel model(job, 0, {{0, job.model.num_layers}}, true, true, 11, {}, fsdp);
  model.plan_activation_memory({&program}, program_orders({&program}));
  MemoryReport report;
  model.fill_memory_report(report);
  int64_t layer_bytes = 0;
  int64_t peak = 0;
  for (int64_t t = 0; t < static_cast<int64_t>(program.instructions.size()); ++t) {
    int64_t live = 0;
    for (const ArenaBufferRecord& b : report.buffers) {
      if (!b.name.ends_with(".fsdp.weights")) continue;
      EXPECT_TRUE(layer_bytes == 0 || b.bytes == layer_bytes) << b.name;
      layer_bytes = b.bytes;
      if (b.first_instruction <= t && t <= b.last_instruction) live += b.bytes;
    }
    peak = std::max(peak, live);
  }
  EXPECT_GT(layer_bytes, 0);
  return layer_bytes > 0 ? peak / layer_bytes : 0;
}

TEST_F(FsdpInterpreter, GatheredWeightsLiveAtOnceAreWhatThePlanCounts) {
  ASSERT_TRUE(plan_.options.fsdp->reshard_after_forward);
  // The golden plan: two layer pairs a task. An SI task's first gathers issued with the task
  // before's last pair's first op held five (that task's first forward layer runs late).
  EXPECT_LE(gathered_peak_layers(plan_, job_), 4);  // 2 strands x (running + prefetched)
  // 8 layers, 4 micro-batches: SI tasks of 4 layer pairs in 4-layer windows. One rule per
  // layer pair (a pair's first op, of either strand, gathering the next pair) held 7: the
  // strand that lagged kept its earlier layers. Per strand it held 5 while a layer's
  // backward weights stayed in the arena up to its reduce-scatter, which reads only the
  // gradient (runtime/memory/buffer_spans.h, backward_weights).
  JobSpec longer = job_;
  longer.model.num_layers = 8;
  longer.parallel.global_batch_size = 32;
  const Plan plan = test_jobs::model_plan(longer);
  ASSERT_TRUE(plan.options.fsdp.has_value());
  EXPECT_LE(gathered_peak_layers(plan, longer), 4);
}

}  // namespace
}  // namespace dhelix::rt
