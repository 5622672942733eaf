#include "lib/plan/rank_program.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>

#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

std::string plan_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json";
}

struct Loaded {
  Plan plan;
  JobSpec job;
};

Loaded load(const std::string& name) {
  Loaded loaded{read_plan(plan_path(name)), {}};
  loaded.job = job_from_plan(loaded.plan, name);
  return loaded;
}

int64_t world_size(const JobSpec& job) {
  return job.parallel.dp * job.parallel.tp * job.parallel.pp * job.parallel.cp;
}

TEST(RankProgram, TransferTagEncodesMicroBatchBoundaryAndDirection) {
  // (mb * (L + 2) + layer + 1) * 2 + gradient, L = 4.
  EXPECT_EQ(transfer_tag(0, 0, false, 4), 2);
  EXPECT_EQ(transfer_tag(0, -1, true, 4), 1);
  EXPECT_EQ(transfer_tag(3, 2, true, 4), (3 * 6 + 3) * 2 + 1);
}

// Every op of every layer the stage holds runs exactly once per micro-batch, in both modes,
// and every dependency points backwards.
TEST(RankProgram, EveryLayerOpRunsOncePerMicroBatch) {
  for (const std::string name : {"tiny-tp2-pp2", "tiny-dp2-tp2", "tiny-tp2"}) {
    const Loaded l = load(name);
    for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
      for (int64_t rank = 0; rank < world_size(l.job); ++rank) {
        const RankProgram program = lower_rank_program(l.plan, l.job, rank, mode);
        std::map<std::tuple<int64_t, int64_t, std::string>, int> seen;
        for (size_t i = 0; i < program.instructions.size(); ++i) {
          const Instruction& ins = program.instructions[i];
          for (int64_t dep : ins.deps) ASSERT_LT(dep, static_cast<int64_t>(i)) << name;
          if (ins.kind == InstructionKind::kCompute || ins.kind == InstructionKind::kCollective) {
            ++seen[{ins.micro_batch, ins.layer, std::string(ins.op)}];
          }
        }
        for (const auto& [key, count] : seen) {
          EXPECT_EQ(count, 1) << name << " rank " << rank << " " << std::get<2>(key);
        }
        // Layers: 14 forward + 18 backward ops (TP + SP) per layer and micro-batch.
        const PlanStage& stage = l.plan.stages[static_cast<size_t>(program.stage)];
        const int64_t layers = stage.down_layers.count + stage.up_layers.count;
        int64_t layer_ops = 0;
        for (const auto& [key, count] : seen) layer_ops += std::get<1>(key) >= 0 ? count : 0;
        EXPECT_EQ(layer_ops, layers * 32 * l.plan.num_micro_batches) << name;
      }
    }
  }
}

// A full-recompute plan (examples/plans/tiny-tp2-recompute.json): every layer's backward
// repeats the layer's 14 forward ops (bwd.recompute.*) once per micro-batch, before any
// other backward op of that layer and micro-batch.
TEST(RankProgram, RecomputePlanRepeatsEveryForwardOpBeforeTheBackward) {
  const Loaded l = load("tiny-tp2-recompute");
  ASSERT_EQ(l.job.parallel.recompute.granularity, RecomputeGranularity::kFull);
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const RankProgram program = lower_rank_program(l.plan, l.job, 0, mode);
    std::map<std::pair<int64_t, int64_t>, int> repeats;
    std::map<std::pair<int64_t, int64_t>, bool> backward_started;
    for (const Instruction& ins : program.instructions) {
      if (ins.layer < 0 || !std::string_view(ins.op).starts_with("bwd.")) continue;
      const std::pair<int64_t, int64_t> key{ins.micro_batch, ins.layer};
      if (std::string_view(ins.op).starts_with("bwd.recompute.")) {
        EXPECT_FALSE(backward_started[key]) << ins.op << " after the backward began";
        ++repeats[key];
      } else {
        backward_started[key] = true;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(repeats.size()), 4 * l.plan.num_micro_batches);
    for (const auto& [key, count] : repeats) EXPECT_EQ(count, 14);
  }
}

TEST(RankProgram, CoExecutedBlocksEndInBarriers) {
  const Loaded l = load("tiny-tp2");
  const RankProgram program = lower_rank_program(l.plan, l.job, 0, ExecutionMode::kCoExecuted);
  // Find the first instruction of block 1 of some SI task: it depends on the last
  // instruction of block 0 on each stream block 0 used.
  for (size_t i = 1; i < program.instructions.size(); ++i) {
    const Instruction& ins = program.instructions[i];
    const Instruction& before = program.instructions[i - 1];
    if (ins.block != 1 || before.block != 0 || ins.task != before.task) continue;
    std::map<StreamClass, int64_t> last;
    for (size_t j = 0; j < i; ++j) {
      const Instruction& b = program.instructions[j];
      if (b.task == ins.task && b.block == 0) last[b.stream] = static_cast<int64_t>(j);
    }
    for (const auto& [stream, index] : last) {
      EXPECT_TRUE(std::find(ins.deps.begin(), ins.deps.end(), index) != ins.deps.end())
          << stream_class_name(stream);
    }
    return;
  }
  FAIL() << "no SI block task with two blocks in tiny-tp2";
}

// Every send has exactly one receive with the same tag, size and opposite ends.
TEST(RankProgram, SendsMatchReceivesAcrossStages) {
  const Loaded l = load("tiny-tp2-pp2");
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    std::multiset<std::tuple<int64_t, int64_t, int64_t, int64_t>> sends;
    std::multiset<std::tuple<int64_t, int64_t, int64_t, int64_t>> receives;
    for (int64_t rank = 0; rank < world_size(l.job); ++rank) {
      for (const Instruction& ins : lower_rank_program(l.plan, l.job, rank, mode).instructions) {
        if (ins.kind == InstructionKind::kSend) sends.insert({rank, ins.peer, ins.tag, ins.bytes});
        if (ins.kind == InstructionKind::kRecv) {
          receives.insert({ins.peer, rank, ins.tag, ins.bytes});
        }
      }
    }
    EXPECT_EQ(sends, receives);
    // 4 micro-batches x (down->up activation across the stage boundary and back, twice:
    // layer 0 -> 1 and layer 2 -> 3, forward and backward) = 4 x 2 x 2 per TP rank pair.
    EXPECT_EQ(sends.size(), 4u * 2u * 2u * 2u);
  }
}

TEST(RankProgram, OpBeforeItsInputIsRefused) {
  Loaded l = load("tiny-tp2");
  // Move the first timing of the first block to the end of the last block: the op that
  // opens the layer now runs after the ops that read its output.
  PlanPairing& pairing = l.plan.pairings[0];
  std::vector<PlanBlock>& blocks =
      pairing.window_blocks.empty() ? pairing.layer_blocks : pairing.window_blocks;
  const PlanOpTiming moved = blocks.front().timings.front();
  blocks.front().timings.erase(blocks.front().timings.begin());
  blocks.back().timings.push_back(moved);
  try {
    lower_rank_program(l.plan, l.job, 0, ExecutionMode::kCoExecuted);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(error.what()).find("runs before its input"), std::string::npos)
        << error.what();
  }
}

TEST(RankProgram, RankOutsideTheJobIsRefused) {
  const Loaded l = load("tiny-tp2");
  try {
    lower_rank_program(l.plan, l.job, 2, ExecutionMode::kCoExecuted);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "plan: rank 2 does not exist: the plan's job has 2 ranks");
  }
}

TEST(PlanJob, PlanForAnotherJobIsRefused) {
  const Loaded l = load("tiny-tp2");
  const JobSpec other =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-dp2-tp2.json");
  try {
    check_plan_matches_job(l.plan, "tiny-tp2.json", other, "tiny-dp2-tp2.json");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("tiny-tp2.json: the plan was made for another job than "
                        "tiny-dp2-tp2.json: parallel settings"),
              std::string::npos)
        << what;
  }
  // Its own job passes.
  check_plan_matches_job(
      l.plan, "tiny-tp2.json",
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-tp2.json"),
      "tiny-tp2.json");
}

TEST(TransferTag, DecodeInvertsTheEncoding) {
  for (int64_t mb = 0; mb < 3; ++mb) {
    for (int64_t layer = -1; layer <= 4; ++layer) {
      for (bool gradient : {false, true}) {
        const TransferTagFields fields{.micro_batch = mb, .layer = layer, .gradient = gradient};
        EXPECT_EQ(decode_transfer_tag(transfer_tag(mb, layer, gradient, 4), 4), fields);
      }
    }
  }
}

TEST(TransferTag, DescribesTheMessage) {
  // (mb * (L + 2) + layer + 1) * 2 + gradient with L = 4.
  EXPECT_EQ(describe_transfer_tag((1 * 6 + 3) * 2, 4), "micro-batch 1, activation into layer 2");
  EXPECT_EQ(describe_transfer_tag((0 * 6 + 5) * 2, 4), "micro-batch 0, activation into the head");
  EXPECT_EQ(describe_transfer_tag((2 * 6 + 4) * 2 + 1, 4),
            "micro-batch 2, gradient of layer 3's output");
  EXPECT_EQ(describe_transfer_tag(1, 4), "micro-batch 0, gradient of the embedding's output");
}

}  // namespace
}  // namespace dhelix
