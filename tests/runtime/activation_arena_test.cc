// The activation arena: the packing (runtime/memory/arena_plan.h) against hand-worked
// cases, the happens-before order of spans (runtime/memory/buffer_spans.h) on a hand-made
// program, and a stage model laid out for the shipped tiny plans (runtime/model/
// activation_arena.h): what it keeps, and that full recompute keeps no saved activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/exec/stream_lowering.h"
#include "runtime/memory/arena_plan.h"
#include "runtime/memory/buffer_spans.h"
#include "runtime/model/stage_model.h"
#include "tests/runtime/shipped_plan.h"

namespace dhelix::rt {
namespace {

TEST(ArenaPlan, TheWorkedExampleOfTheHeader) {
  // A 4, B 3, C 2; A conflicts with B and C; B and C never live together.
  const std::vector<std::vector<bool>> conflict = {
      {false, true, true}, {true, false, false}, {true, false, false}};
  const ArenaPlacement p = pack_blocks(
      {4, 3, 2}, [&](size_t i, size_t j) { return conflict[i][j]; }, 1);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(p.arena_bytes, 7);
}

TEST(ArenaPlan, NoConflictSharesEverythingAllConflictsStackAligned) {
  const auto none = pack_blocks(
      {100, 300, 200}, [](size_t, size_t) { return false; }, 256);
  EXPECT_EQ(none.offsets, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(none.arena_bytes, 512);  // 300 rounded up to 256s
  const auto all = pack_blocks(
      {100, 300, 200}, [](size_t, size_t) { return true; }, 256);
  EXPECT_EQ(all.arena_bytes, 256 + 512 + 256);
  // Largest first: 300 at 0, then 200 and 100 after it.
  EXPECT_EQ(all.offsets[1], 0);
}

TEST(ArenaPlan, BestFitTakesTheSmallestGapThatHolds) {
  // Sizes 8, 7, 6, 5, 2, placed in that order. 0 at [0, 8); 1 (conflicts with 0) at
  // [8, 15); 2 (with 0 and 1) at [15, 21); 3 (with 0 and 2) in the gap [8, 15) at 8; 4 (with
  // 0, 2, 3) sees [0, 8), [8, 13), [15, 21): the 2-byte gap at 13 fits exactly.
  const std::vector<std::vector<int>> edges = {
      {1, 2, 3, 4}, {0, 2}, {0, 1, 3, 4}, {0, 2, 4}, {0, 2, 3}};
  const auto conflicts = [&](size_t i, size_t j) {
    return std::find(edges[i].begin(), edges[i].end(), static_cast<int>(j)) != edges[i].end();
  };
  const ArenaPlacement p = pack_blocks({8, 7, 6, 5, 2}, conflicts, 1);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 8, 15, 8, 13}));
  EXPECT_EQ(p.arena_bytes, 21);
}

TEST(ArenaPlan, LivePeakIsTheLargestSumAtOnePosition) {
  // [0, 2] 5 bytes, [2, 4] 3 bytes, [3, 5] 4 bytes: position 2 holds 8, 3..4 hold 7.
  EXPECT_EQ(live_peak_bytes({5, 3, 4}, {{0, 2}, {2, 4}, {3, 5}}), 8);
  EXPECT_EQ(live_peak_bytes({5, 3}, {{0, 1}, {2, 3}}), 5);
}

Instruction compute(std::vector<int64_t> deps, int64_t layer, std::string_view op) {
  Instruction i;
  i.kind = InstructionKind::kCompute;
  i.stream = StreamClass::kCompute;
  i.op = op;
  i.layer = layer;
  i.deps = std::move(deps);
  return i;
}

// The example of buffer_spans.h: C0 writes A, L1 reads A (waits on C0), C2 writes B.
TEST(BufferSpans, ProgramOrderFollowsWaitsNotProgramPositions) {
  RankProgram program;
  program.instructions.push_back(compute({}, 0, "fwd.ln_attn"));
  Instruction gather = compute({0}, 0, "fwd.allgather_attn");
  gather.kind = InstructionKind::kCollective;
  gather.stream = StreamClass::kLocalComm;
  gather.group = ParallelDim::kTp;
  program.instructions.push_back(gather);
  program.instructions.push_back(compute({}, 1, "fwd.ln_attn"));
  program.instructions.push_back(compute({1}, 1, "fwd.gemm_qkv"));
  const ProgramOrder order = program_order(program);
  EXPECT_TRUE(order.finished_before_start(0, 1));
  EXPECT_TRUE(order.finished_before_start(0, 2));   // stream order
  EXPECT_FALSE(order.finished_before_start(1, 2));  // no wait: may overlap
  EXPECT_TRUE(order.finished_before_start(1, 3));   // the wait on 1

  const auto owner = [](std::string_view) { return ExtraOwner::kHead; };
  const auto uses = span_uses(program, order, 2, owner);
  const SpanUses& a = uses.at({SpanKind::kLayerForward, 0, 0});
  const SpanUses& b = uses.at({SpanKind::kLayerForward, 0, 1});
  // Layer 1's forward starts with 2, which may overlap layer 0's gather.
  EXPECT_FALSE(ordered_before(a, b, order));
  // In program order (sequential mode) they are ordered.
  program.mode = ExecutionMode::kSequential;
  const ProgramOrder sequential = program_order(program);
  const auto seq_uses = span_uses(program, sequential, 2, owner);
  EXPECT_TRUE(ordered_before(seq_uses.at({SpanKind::kLayerForward, 0, 0}),
                             seq_uses.at({SpanKind::kLayerForward, 0, 1}), sequential));
}

TEST(BufferSpans, AReceivedBufferIsLiveFromTheStart) {
  RankProgram program;
  program.mode = ExecutionMode::kSequential;
  program.instructions.push_back(compute({}, 0, "fwd.ln_attn"));
  Instruction recv;
  recv.kind = InstructionKind::kRecv;
  recv.op = "p2p.activation";
  recv.layer = 5;
  program.instructions.push_back(recv);
  const ProgramOrder order = program_order(program);
  const auto uses =
      span_uses(program, order, 8, [](std::string_view) { return ExtraOwner::kHead; });
  const SpanUses& received = uses.at({SpanKind::kResidual, 0, 5});
  EXPECT_TRUE(received.from_start);
  EXPECT_FALSE(ordered_before(uses.at({SpanKind::kLayerForward, 0, 0}), received, order));
}

// Rank 0 of a shipped tiny plan, laid out for both of its programs.
MemoryReport laid_out(const std::string& name) {
  const PlannedJob shipped_job = shipped(name);
  const Plan& plan = shipped_job.plan;
  const JobSpec& job = shipped_job.job;
  const RankProgram co = lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted);
  const RankProgram seq = lower_rank_program(plan, job, 0, ExecutionMode::kSequential);
  const PlanStage& stage = plan.stages.front();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
    if (range.count > 0) ranges.emplace_back(range.first, range.count);
  }
  StageModel model(job, 0, ranges, stage.embedding, stage.head_loss, 7);
  model.plan_activation_memory({&co, &seq}, program_orders({&co, &seq}));
  MemoryReport report;
  model.fill_memory_report(report);
  // Bound again, every instruction finds its buffers in the arena.
  for (const Instruction& i : co.instructions) {
    if (i.kind == InstructionKind::kCompute || i.kind == InstructionKind::kCollective) {
      static_cast<void>(
          model.bind({.op = std::string(i.op), .layer = i.layer, .micro_batch = i.micro_batch}));
    }
  }
  return report;
}

int64_t bytes_named(const MemoryReport& report, std::string_view part) {
  int64_t sum = 0;
  for (const ArenaBufferRecord& b : report.buffers) {
    if (b.name.find(part) != std::string::npos) sum += b.bytes;
  }
  return sum;
}

TEST(ActivationArena, TinyPlanPacksBelowTheSumAndAboveTheLivePeak) {
  const MemoryReport r = laid_out("tiny-tp2");
  int64_t sum = 0;
  for (const ArenaBufferRecord& b : r.buffers) sum += b.bytes;
  EXPECT_GT(r.activation_arena_bytes, 0);
  EXPECT_GE(r.activation_arena_bytes, r.activation_live_peak_bytes);
  EXPECT_LT(r.activation_arena_bytes, sum / 2);  // reuse, not one buffer each
  // tp 2 with SP: a layer's saved attention input is the gathered [T, h] (fp32): 2 x 64
  // tokens x hidden.
  EXPECT_GT(bytes_named(r, ".saved.attn_in"), 0);
}

TEST(ActivationArena, FullRecomputeKeepsNoSavedActivations) {
  const MemoryReport plain = laid_out("tiny-tp2");
  const MemoryReport recompute = laid_out("tiny-tp2-recompute");
  EXPECT_GT(bytes_named(plain, ".saved."), 0);
  EXPECT_EQ(bytes_named(recompute, ".saved."), 0);
  EXPECT_GT(bytes_named(recompute, ".backward.re."), 0);
  EXPECT_LT(recompute.activation_arena_bytes, plain.activation_arena_bytes);
}

// What the plan counts of a layer (planner/memory_model.h, per token: 4h/t of norm and GEMM
// inputs, (2q + 2kv)/t of attention, 3f/t of SwiGLU) is what the arena's count holds at its
// peak: on tiny-tp2 (h 64, q 64, kv 32, f 128, t 2, 128 tokens, fp32) 416 elements a token,
// 212992 bytes a layer and micro-batch, five such sets at the peak; CP halves the tokens;
// full recompute keeps four layer inputs (16384 bytes each) and one recomputed layer.
TEST(ActivationArena, ThePlansCountEqualsThePlansPrediction) {
  for (const char* name : {"tiny-tp2", "tiny-cp2-tp2", "tiny-tp2-recompute"}) {
    const Plan plan = shipped(name).plan;
    const PlanScheme* dhelix = nullptr;
    for (const PlanScheme& scheme : plan.schemes) {
      if (scheme.scheme == PipelineScheme::kDHelix) dhelix = &scheme;
    }
    ASSERT_NE(dhelix, nullptr);
    EXPECT_EQ(laid_out(name).activation_counted_peak_bytes, dhelix->memory.front().activation_bytes)
        << name;
  }
  EXPECT_EQ(laid_out("tiny-tp2").activation_counted_peak_bytes, 5 * 212992);
  EXPECT_EQ(laid_out("tiny-cp2-tp2").activation_counted_peak_bytes, 5 * 212992 / 2);
  EXPECT_EQ(laid_out("tiny-tp2-recompute").activation_counted_peak_bytes, 4 * 16384 + 212992);
}

}  // namespace
}  // namespace dhelix::rt
