// dhelix-run's measured memory: the activation bytes live over a traced step
// (runtime/train/memory_timeline.h), the instruction map of a sequential trace, and the
// per-rank record that travels to rank 0 and is printed (runtime/train/memory_record.h).
#include "runtime/train/memory_timeline.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "runtime/train/memory_record.h"

namespace dhelix::rt {
namespace {

// The header's worked case: iteration 0..100 ns, instructions 0 (10..20) and 1 (30..40).
MemoryReport worked_report() {
  MemoryReport r;
  r.buffers = {{"A", 0, 8, 0, 1}, {"B", 8, 4, 1, 1}, {"C", 12, 2, -1, -1}};
  return r;
}

std::vector<OpTiming> worked_ops() { return {{5, 10, 20}, {25, 30, 40}}; }

TEST(MemoryTimeline, WorkedCase) {
  const std::vector<MemorySample> expected = {{0, 2}, {10, 10}, {30, 14}, {40, 2}, {100, 0}};
  EXPECT_EQ(activation_timeline(worked_report(), worked_ops(), {}, 0, 100), expected);
}

TEST(MemoryTimeline, EmptyArenaIsZeroThroughout) {
  const std::vector<MemorySample> expected = {{0, 0}};
  EXPECT_EQ(activation_timeline(MemoryReport{}, worked_ops(), {}, 0, 100), expected);
}

TEST(MemoryTimeline, SameTimeChangesMergeAndUnknownInstructionsSpanTheIteration) {
  MemoryReport r;
  // D ends at 20 where E starts at 20: one sample of their net; F names instruction 9 of a
  // two-instruction program, so it counts as live over the whole iteration.
  r.buffers = {{"D", 0, 8, 0, 0}, {"E", 0, 8, 1, 1}, {"F", 8, 1, 9, 9}};
  const std::vector<OpTiming> ops = {{0, 10, 20}, {0, 20, 30}};
  const std::vector<MemorySample> expected = {{0, 1}, {10, 9}, {30, 1}, {50, 0}};
  EXPECT_EQ(activation_timeline(r, ops, {}, 0, 50), expected);
}

TEST(MemoryTimeline, MappedTimingsSpanBothInstructions) {
  // Traced order reversed: co-executed instruction 0 ran as traced 1 (30..40), 1 as 0.
  const std::vector<int64_t> map = {1, 0};
  const std::vector<MemorySample> expected = {{0, 2}, {10, 14}, {20, 10}, {40, 2}, {100, 0}};
  EXPECT_EQ(activation_timeline(worked_report(), worked_ops(), map, 0, 100), expected);
}

TEST(MemoryTimeline, SequentialProgramMapsOntoTheCoExecutedOne) {
  const Plan plan = read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json");
  const JobSpec job = job_from_plan(plan, "tiny-tp2-pp2");
  for (int64_t rank : {0, 3}) {
    const RankProgram co = lower_rank_program(plan, job, rank, ExecutionMode::kCoExecuted);
    const RankProgram seq = lower_rank_program(plan, job, rank, ExecutionMode::kSequential);
    const std::vector<int64_t> map = instruction_map(co, seq);
    ASSERT_EQ(map.size(), co.instructions.size()) << "rank " << rank;
    EXPECT_EQ(std::set<int64_t>(map.begin(), map.end()).size(), map.size());  // a permutation
    for (size_t i = 0; i < map.size(); ++i) {
      const Instruction& a = co.instructions[i];
      const Instruction& b = seq.instructions[static_cast<size_t>(map[i])];
      EXPECT_EQ(a.op, b.op);
      EXPECT_EQ(a.layer, b.layer);
      EXPECT_EQ(a.micro_batch, b.micro_batch);
    }
    EXPECT_EQ(instruction_map(co, co).size(), co.instructions.size());
  }
  // Programs of different stages hold different instructions: no map.
  EXPECT_TRUE(instruction_map(lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted),
                              lower_rank_program(plan, job, 3, ExecutionMode::kCoExecuted))
                  .empty());
}

TEST(MemoryRecord, FlattenRoundTripAndLines) {
  MemoryReport r = worked_report();
  r.weight_bytes = 13107200;  // 12.5 MiB
  r.gradient_bytes = 13107200;
  r.optimizer_bytes = 26214400;
  r.activation_arena_bytes = 42074112;         // 40.125 MiB
  r.activation_live_peak_bytes = 40370176;     // 38.5 MiB
  r.activation_counted_peak_bytes = 31457280;  // 30 MiB
  r.optimizer_shards = 2;
  const std::vector<int64_t> flat = flatten_memory(1, r);
  const RankMemory back = unflatten_memory(3, flat.data(), flat.size());
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.stage, 1);
  EXPECT_EQ(back.report.activation_arena_bytes, r.activation_arena_bytes);
  EXPECT_EQ(back.report.optimizer_shards, 2);
  EXPECT_EQ(back.report.weight_bytes_per_parameter, 4);
  ASSERT_EQ(back.report.buffers.size(), 3u);
  EXPECT_EQ(back.report.buffers[1].offset, 8);
  EXPECT_EQ(back.report.buffers[2].first_instruction, -1);
  EXPECT_EQ(memory_report_lines({back}),
            "memory rank 3 (stage 1): weights 12.500 MiB, gradients 12.500 MiB, optimizer "
            "states 25.000 MiB, activations 40.125 MiB peak (live peak 38.500 MiB, of which the "
            "plan counts 30.000 MiB)\n");
  const OrderedJson json = memory_record_json(back);
  EXPECT_EQ(json["optimizer_bytes"], 26214400);
  EXPECT_EQ(json["buffers"], 3);
  EXPECT_EQ(json["optimizer_shards"], 2);
}

}  // namespace
}  // namespace dhelix::rt
