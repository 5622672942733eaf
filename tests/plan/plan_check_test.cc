#include "lib/plan/plan_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

std::string plan_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json";
}

struct Lowered {
  Plan plan;
  JobSpec job;
  std::vector<RankProgram> programs;  // co-executed, one per rank
};

Lowered lower(const std::string& name, ExecutionMode mode = ExecutionMode::kCoExecuted) {
  Lowered l{read_plan(plan_path(name)), {}, {}};
  l.job = job_from_plan(l.plan, name + ".json");
  const int64_t world = l.job.parallel.world_size();
  for (int64_t rank = 0; rank < world; ++rank) {
    l.programs.push_back(lower_rank_program(l.plan, l.job, rank, mode));
  }
  return l;
}

std::vector<std::string> messages(const PlanCheckReport& report) {
  std::vector<std::string> out;
  for (const Problem& problem : report.problems.problems()) out.push_back(problem.to_string());
  return out;
}

std::string all(const PlanCheckReport& report) {
  std::string out;
  for (const std::string& m : messages(report)) out += m + "\n";
  return out;
}

// The problems of checks 1 to 5 only: a test that edits a plan to make the programs hang or
// misorder also breaks what checks 6 to 10 compare (task indices, waits_for, block lists).
std::vector<std::string> program_messages(const PlanCheckReport& report) {
  std::vector<std::string> out;
  for (const std::string& m : messages(report)) {
    const bool field =
        m.find("/index:") != std::string::npos || m.find("/waits_for:") != std::string::npos ||
        m.find("_ops:") != std::string::npos || m.find("/timings/") != std::string::npos;
    if (!field) out.push_back(m);
  }
  return out;
}

PlanCheckReport check(const Lowered& l, const std::string& file) {
  PlanCheckReport report;
  check_programs(l.plan, l.job, l.programs, file, report);
  return report;
}

// Removes instruction `index` from `program`, renumbering the dependencies behind it.
void erase_instruction(RankProgram& program, int64_t index) {
  auto& ins = program.instructions;
  ins.erase(ins.begin() + index);
  for (Instruction& i : ins) {
    std::vector<int64_t> deps;
    for (int64_t d : i.deps) {
      if (d != index) deps.push_back(d > index ? d - 1 : d);
    }
    i.deps = deps;
  }
}

// The index of the n-th instruction of `kind` (0-based) in `program`.
int64_t nth(const RankProgram& program, InstructionKind kind, int n) {
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    if (program.instructions[i].kind == kind && n-- == 0) return static_cast<int64_t>(i);
  }
  ADD_FAILURE() << "no such instruction";
  return -1;
}

// ----- every shipped plan passes -------------------------------------------------------------

TEST(PlanCheck, ShippedTinyPlansPassWithTheirSummaries) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"tiny-tp2",
       "tiny-tp2.json: ok: 2 ranks, 568 instructions, 1 collective groups consistent, 0 "
       "transfers matched, no wait cycle, memory fits (peak 2.7 MiB of 1.8 GiB)"},
      {"tiny-dp2-tp2",
       "tiny-dp2-tp2.json: ok: 4 ranks, 1136 instructions, 2 collective groups consistent, 0 "
       "transfers matched, no wait cycle, memory fits (peak 2.2 MiB of 1.8 GiB)"},
      {"tiny-tp2-pp2",
       "tiny-tp2-pp2.json: ok: 4 ranks, 1200 instructions, 2 collective groups consistent, 32 "
       "transfers matched, no wait cycle, memory fits (peak 2.0 MiB of 1.8 GiB)"},
  };
  for (const auto& [name, summary] : expected) {
    const PlanCheckReport report = check_plan(read_plan(plan_path(name)), name + ".json");
    EXPECT_TRUE(report.ok()) << all(report);
    EXPECT_TRUE(report.warnings.empty());
    EXPECT_EQ(plan_check_summary_text(report, name + ".json"), summary);
  }
}

TEST(PlanCheck, SequentialProgramsPassToo) {
  const Lowered l = lower("tiny-tp2-pp2", ExecutionMode::kSequential);
  const PlanCheckReport report = check(l, "tiny-tp2-pp2.json");
  EXPECT_TRUE(report.ok()) << all(report);
}

// ----- (a) collectives out of order on one rank ----------------------------------------------

TEST(PlanCheck, SwappedCollectivesOnOneRankAreNamed) {
  Lowered l = lower("tiny-tp2");
  // Rank 1 issues its first two collectives the other way round (what they are, not where
  // they sit in the program: the dependencies stay).
  RankProgram& rank1 = l.programs[1];
  Instruction& a =
      rank1.instructions[static_cast<size_t>(nth(rank1, InstructionKind::kCollective, 0))];
  Instruction& b =
      rank1.instructions[static_cast<size_t>(nth(rank1, InstructionKind::kCollective, 1))];
  std::swap(a.op, b.op);
  std::swap(a.collective, b.collective);
  std::swap(a.bytes, b.bytes);
  std::swap(a.layer, b.layer);
  const PlanCheckReport report = check(l, "tiny-tp2.json");
  EXPECT_EQ(messages(report),
            std::vector<std::string>{
                "tiny-tp2.json: /stages/0/tasks/0: co-executed: tp group [0, 1] on stream "
                "local_comm: collective 0 differs: rank 0 stage 0 task 0 (F0d): "
                "fwd.reduce_scatter_embedding, micro-batch 0 issues reduce_scatter of 32768 "
                "bytes; rank 1 stage 0 task 0 (F0d): fwd.allgather_attn, layer 0, micro-batch 0 "
                "issues all_gather of 32768 bytes"});
}

// ----- (b) a missing receive -----------------------------------------------------------------

TEST(PlanCheck, MissingReceiveIsNamed) {
  Lowered l = lower("tiny-tp2-pp2");
  erase_instruction(l.programs[2], nth(l.programs[2], InstructionKind::kRecv, 0));
  const PlanCheckReport report = check(l, "tiny-tp2-pp2.json");
  EXPECT_EQ(messages(report),
            std::vector<std::string>{
                "tiny-tp2-pp2.json: /stages/0/tasks/0: co-executed: rank 0 stage 0 task 0 (F0d): "
                "p2p.activation, layer 1, micro-batch 0 (send of 16384 bytes, tag 4, to rank 2) "
                "has no matching receive on rank 2"});
}

TEST(PlanCheck, MissingSendLeavesAReceiveWaitingForever) {
  Lowered l = lower("tiny-tp2-pp2");
  erase_instruction(l.programs[0], nth(l.programs[0], InstructionKind::kSend, 0));
  const PlanCheckReport report = check(l, "tiny-tp2-pp2.json");
  EXPECT_EQ(messages(report),
            (std::vector<std::string>{
                "tiny-tp2-pp2.json: /stages/1/tasks/0: co-executed: rank 2 stage 1 task 0 (F0d): "
                "p2p.activation, layer 1, micro-batch 0 (recv of 16384 bytes, tag 4, from rank "
                "0) has no matching send on rank 0",
                "tiny-tp2-pp2.json: /stages/1/tasks/0: co-executed: deadlock: 1130 of 1199 "
                "instructions never run; rank 2 stage 1 task 0 (F0d): p2p.activation, layer 1, "
                "micro-batch 0 [receive stream] waits for a send that rank 0 never issues"}));
}

TEST(PlanCheck, MissingCollectiveOnOneRankIsNamed) {
  Lowered l = lower("tiny-tp2");
  // Rank 0 leaves out its last collective: rank 1 waits for it at the end of the iteration.
  int64_t last = -1;
  for (size_t i = 0; i < l.programs[0].instructions.size(); ++i) {
    if (l.programs[0].instructions[i].kind == InstructionKind::kCollective) {
      last = static_cast<int64_t>(i);
    }
  }
  erase_instruction(l.programs[0], last);
  const PlanCheckReport report = check(l, "tiny-tp2.json");
  EXPECT_EQ(messages(report),
            (std::vector<std::string>{
                "tiny-tp2.json: /stages/0/tasks/7: co-executed: tp group [0, 1] on stream "
                "local_comm: rank 1 issues 74 collectives, rank 0 issues 73; the first without a "
                "partner is collective 73: rank 1 stage 0 task 7 (B1d): bwd.allgather_embedding, "
                "micro-batch 1 issues all_gather of 32768 bytes",
                "tiny-tp2.json: /stages/0/tasks/7: co-executed: deadlock: 2 of 567 instructions "
                "never run; rank 1 stage 0 task 7 (B1d): bwd.allgather_embedding, micro-batch 1 "
                "[local_comm stream] waits for rank 0, which issues only 73 collectives on the tp "
                "group [0, 1] on stream local_comm"}));
}

// ----- (c) a wait cycle ----------------------------------------------------------------------

TEST(PlanCheck, WaitCycleBetweenStagesIsFound) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  // Stage 0 runs F0u (needs stage 1's micro-batch 0 output) before F1d (sends micro-batch 1);
  // stage 1 runs F1d and F1u (need micro-batch 1) before F0d and F0u (micro-batch 0).
  std::vector<PlanTask>& s0 = plan.stages[0].tasks;
  std::swap(s0[1], s0[2]);
  std::vector<PlanTask>& s1 = plan.stages[1].tasks;
  std::rotate(s1.begin(), s1.begin() + 2, s1.begin() + 4);
  const PlanCheckReport report = check_plan(plan, "cycle.json");
  // One cycle per TP rank pair (ranks 0 and 2, ranks 1 and 3), in each mode.
  const std::vector<std::string> found = program_messages(report);
  ASSERT_EQ(found.size(), 4u) << all(report);
  EXPECT_EQ(found[0],
            "cycle.json: /stages/0/tasks/1: co-executed: deadlock: 1166 of 1200 instructions "
            "never run; wait cycle: rank 0 stage 0 task 2 (F0u): p2p.activation, layer 3, "
            "micro-batch 0 [receive stream] waits for its send rank 2 stage 1 task 1 (F0u): "
            "p2p.activation, layer 3, micro-batch 0 [cross_comm stream], which is queued behind "
            "rank 2 stage 1 task 3 (F1u): p2p.activation, layer 3, micro-batch 1 [cross_comm "
            "stream], which waits for its dependency rank 2 stage 1 task 2 (F1d): "
            "p2p.activation, layer 1, micro-batch 1 [receive stream], which waits for its send "
            "rank 0 stage 0 task 1 (F1d): p2p.activation, layer 1, micro-batch 1 [cross_comm "
            "stream], which waits for its dependency rank 0 stage 0 task 2 (F0u): "
            "p2p.activation, layer 3, micro-batch 0 [receive stream]");
  EXPECT_EQ(found[2],
            "cycle.json: /stages/0/tasks/1: sequential: deadlock: 1166 of 1200 instructions "
            "never run; wait cycle: rank 0 stage 0 task 2 (F0u): p2p.activation, layer 3, "
            "micro-batch 0 [in-order stream] waits for its send rank 2 stage 1 task 1 (F0u): "
            "p2p.activation, layer 3, micro-batch 0 [in-order stream], which is queued behind "
            "rank 2 stage 1 task 2 (F1d): p2p.activation, layer 1, micro-batch 1 [in-order "
            "stream], which waits for its send rank 0 stage 0 task 1 (F1d): p2p.activation, "
            "layer 1, micro-batch 1 [in-order stream], which is queued behind rank 0 stage 0 "
            "task 2 (F0u): p2p.activation, layer 3, micro-batch 0 [in-order stream]");
  EXPECT_NE(found[1].find("wait cycle: rank 1 stage 0 task 2 (F0u)"), std::string::npos);
  EXPECT_NE(found[3].find("sequential: deadlock"), std::string::npos);
}

// A program whose streams cannot hang but whose program order can: rank 0 posts its first
// receive from stage 1 before anything else. On its streams that changes nothing (the
// receive waits on a stream of its own); enqueued in program order, as the CUDA executor
// enqueues it, rank 0 waits for stage 1 before sending stage 1 anything.
TEST(PlanCheck, ProgramOrderDeadlockIsFoundEvenWhenTheStreamsCannotHang) {
  Lowered l = lower("tiny-tp2-pp2");
  RankProgram& program = l.programs[0];
  const int64_t receive = nth(program, InstructionKind::kRecv, 0);
  std::vector<Instruction>& ins = program.instructions;
  Instruction moved = ins[static_cast<size_t>(receive)];
  ins.erase(ins.begin() + receive);
  ins.insert(ins.begin(), moved);
  for (Instruction& i : ins) {
    for (int64_t& d : i.deps) {
      if (d == receive) {
        d = 0;
      } else if (d < receive) {
        ++d;
      }
    }
  }
  ins.front().deps.clear();  // a receive needs nothing before it is posted
  const std::vector<std::string> found = messages(check(l, "tiny-tp2-pp2.json"));
  ASSERT_EQ(found.size(), 1u) << all(check(l, "tiny-tp2-pp2.json"));
  EXPECT_EQ(found[0],
            "tiny-tp2-pp2.json: /stages/0/tasks/2: co-executed in program order (the CUDA "
            "executor's enqueue order, which a full launch queue enforces): deadlock: 1199 of "
            "1200 instructions never run; wait cycle: rank 0 stage 0 task 2 (F0u): "
            "p2p.activation, layer 3, micro-batch 0 [in-order stream] waits for its send rank 2 "
            "stage 1 task 1 (F0u): p2p.activation, layer 3, micro-batch 0 [in-order stream], "
            "which is queued behind rank 2 stage 1 task 0 (F0d): p2p.activation, layer 1, "
            "micro-batch 0 [in-order stream], which waits for its send rank 0 stage 0 task 0 "
            "(F0d): p2p.activation, layer 1, micro-batch 0 [in-order stream], which is queued "
            "behind rank 0 stage 0 task 2 (F0u): p2p.activation, layer 3, micro-batch 0 "
            "[in-order stream]");
  EXPECT_NE(found[0].find("wait cycle: rank 0"), std::string::npos) << found[0];
}

// ----- (d) use before definition -------------------------------------------------------------

TEST(PlanCheck, OpBeforeItsInputIsNamedForEveryRank) {
  Plan plan = read_plan(plan_path("tiny-tp2"));
  PlanPairing& pairing = plan.pairings[0];
  std::vector<PlanBlock>& blocks =
      pairing.window_blocks.empty() ? pairing.layer_blocks : pairing.window_blocks;
  const PlanOpTiming moved = blocks.front().timings.front();
  blocks.front().timings.erase(blocks.front().timings.begin());
  blocks.back().timings.push_back(moved);
  const PlanCheckReport report = check_plan(plan, "bad.json");
  EXPECT_EQ(program_messages(report),
            (std::vector<std::string>{
                "bad.json: co-executed: rank 0 does not lower: plan: stage 0 task 3 block 0: "
                "bwd.allgather_mlp runs before its input bwd.bda_mlp (layer 3, micro-batch 0)",
                "bad.json: co-executed: rank 1 does not lower: plan: stage 0 task 3 block 0: "
                "bwd.allgather_mlp runs before its input bwd.bda_mlp (layer 3, micro-batch 0)"}));
}

TEST(PlanCheck, DependencyOnALaterInstructionIsNamed) {
  Lowered l = lower("tiny-tp2");
  l.programs[0].instructions[3].deps.push_back(10);
  l.programs[0].instructions[4].deps.push_back(100000);
  const PlanCheckReport report = check(l, "tiny-tp2.json");
  EXPECT_EQ(messages(report),
            (std::vector<std::string>{
                "tiny-tp2.json: /stages/0/tasks/0: co-executed: rank 0 stage 0 task 0 (F0d): "
                "fwd.allgather_attn, layer 0, micro-batch 0 (instruction 3) uses the result of a "
                "later instruction: rank 0 stage 0 task 0 (F0d): fwd.allgather_mlp, layer 0, "
                "micro-batch 0 (instruction 10 of 284)",
                "tiny-tp2.json: /stages/0/tasks/0: co-executed: rank 0 stage 0 task 0 (F0d): "
                "fwd.gemm_qkv, layer 0, micro-batch 0 (instruction 4) uses the result of "
                "instruction 100000, which does not exist (284 instructions)",
                // Both collectives are on the local_comm stream: a genuine cycle.
                "tiny-tp2.json: /stages/0/tasks/0: co-executed: deadlock: 562 of 568 "
                "instructions never run; wait cycle: rank 0 stage 0 task 0 (F0d): "
                "fwd.allgather_attn, layer 0, micro-batch 0 [local_comm stream] waits for its "
                "dependency rank 0 stage 0 task 0 (F0d): fwd.allgather_mlp, layer 0, micro-batch "
                "0 [local_comm stream], which is queued behind rank 0 stage 0 task 0 (F0d): "
                "fwd.allgather_attn, layer 0, micro-batch 0 [local_comm stream]"}));
}

// ----- (e) memory ----------------------------------------------------------------------------

TEST(PlanCheck, StageOverTheMemoryBudgetIsAProblem) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  plan.memory_budget.usable_bytes = 2000000;  // stage 0 needs 2136320, stage 1 1807360
  PlanCheckReport report;
  check_memory(plan, "tiny-tp2-pp2.json", report);
  EXPECT_EQ(messages(report),
            std::vector<std::string>{
                "tiny-tp2-pp2.json: /schemes/0/memory/0: stage 0 needs 2.0 MiB (2136320 bytes: "
                "weights 0.2 MiB, gradients 0.2 MiB, optimizer states 0.6 MiB, activations 1.0 "
                "MiB) but the CPU rank offers 1.9 MiB usable"});
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(report.summary.peak_memory_bytes, 2136320);
}

TEST(PlanCheck, StageOverTheBudgetIsAWarningWithAllowOom) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  plan.memory_budget.usable_bytes = 2000000;
  plan.options.allow_oom = true;
  PlanCheckReport report;
  check_memory(plan, "tiny-tp2-pp2.json", report);
  EXPECT_TRUE(report.ok()) << all(report);
  EXPECT_EQ(report.warnings,
            std::vector<std::string>{
                "tiny-tp2-pp2.json: /schemes/0/memory/0: stage 0 needs 2.0 MiB (2136320 bytes: "
                "weights 0.2 MiB, gradients 0.2 MiB, optimizer states 0.6 MiB, activations 1.0 "
                "MiB) but the CPU rank offers 1.9 MiB usable (the plan was made with "
                "--allow-oom)"});
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

// ----- checks 6 to 10: the fields the runtime reads besides the programs ---------------------

std::string check_edited(const std::function<void(Plan&)>& edit) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  edit(plan);
  return all(check_plan(plan, "p.json"));
}

// num_micro_batches 4 -> 5 passed and trained with the loss scaled 4/5.
TEST(PlanCheckFields, MicroBatchCountMustBeTheJobs) {
  const std::string problems = check_edited([](Plan& p) { p.num_micro_batches += 1; });
  EXPECT_NE(problems.find("p.json: /num_micro_batches: 5 differs from the job's "
                          "global_batch_size / (micro_batch_size x dp) = 8 / (2 x 1) = 4"),
            std::string::npos)
      << problems;
}

TEST(PlanCheckFields, EveryMicroBatchRunsOnEveryStage) {
  const std::string problems = check_edited([](Plan& p) {
    std::vector<PlanTask>& tasks = p.stages[0].tasks;
    std::erase_if(tasks, [](const PlanTask& t) {
      return (t.forward && t.forward->micro_batch == 3) ||
             (t.backward && t.backward->micro_batch == 3);
    });
    for (size_t i = 0; i < tasks.size(); ++i) tasks[i].index = static_cast<int64_t>(i);
  });
  EXPECT_NE(problems.find("p.json: /stages/0/tasks: micro-batch 3"), std::string::npos) << problems;
}

TEST(PlanCheckFields, WaitsForMustNameTheSenders) {
  const std::string problems = check_edited([](Plan& p) {
    for (PlanTask& t : p.stages[1].tasks) {
      if (!t.waits_for.empty()) {
        t.waits_for.clear();
        break;
      }
    }
  });
  EXPECT_NE(problems.find("/waits_for: [] differs from the transfers the task receives: [stage 0 "
                          "task "),
            std::string::npos)
      << problems;
}

TEST(PlanCheckFields, ReorderedBlockOpsAreRefused) {
  const std::string problems = check_edited([](Plan& p) {
    for (PlanBlock& block : p.pairings[0].layer_blocks) {
      if (block.backward_ops.size() < 2) continue;
      std::swap(block.backward_ops[0], block.backward_ops[1]);
      return;
    }
    FAIL() << "no block with two backward ops";
  });
  EXPECT_NE(problems.find("/backward_ops: ["), std::string::npos) << problems;
  EXPECT_NE(problems.find("differs from the block's bwd timings in start order"), std::string::npos)
      << problems;
}

TEST(PlanCheckFields, AnOpDroppedFromABlockIsRefused) {
  const std::string problems = check_edited([](Plan& p) {
    // A weight-gradient GEMM: nothing in the layer consumes it.
    for (PlanBlock& block : p.pairings[0].layer_blocks) {
      std::erase_if(block.timings, [](const PlanOpTiming& t) { return t.op == "bwd.fc1_wgrad"; });
      std::erase(block.backward_ops, "bwd.fc1_wgrad");
    }
  });
  EXPECT_NE(problems.find("less often than the sequential one"), std::string::npos) << problems;
  // The first differing op in (op, layer, micro-batch) order is the one named.
  EXPECT_NE(problems.find("runs bwd.fc1_wgrad of layer"), std::string::npos) << problems;
}

TEST(PlanCheckFields, ShippedPlansPassTheNewChecks) {
  for (const char* name : {"tiny-tp2", "tiny-tp2-pp2", "tiny-dp2-tp2"}) {
    const PlanCheckReport report = check_plan(read_plan(plan_path(name)), name);
    EXPECT_TRUE(report.ok()) << name << ":\n" << all(report);
  }
}

}  // namespace
}  // namespace dhelix
