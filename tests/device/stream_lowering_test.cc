#include "runtime/exec/stream_lowering.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix::cuda {
namespace {

Instruction make(const std::string& stream, std::vector<int64_t> deps,
                 InstructionKind kind = InstructionKind::kCompute) {
  Instruction instruction;
  instruction.kind = kind;
  instruction.op = "op";
  instruction.stream = kStreamClassNames.parse(stream).value();
  instruction.deps = std::move(deps);
  return instruction;
}

RankProgram program_of(std::vector<Instruction> instructions,
                       ExecutionMode mode = ExecutionMode::kCoExecuted) {
  RankProgram program;
  program.mode = mode;
  program.instructions = std::move(instructions);
  return program;
}

// Whether `from` is ordered after `to` on the device: walking back along stream order and
// the waits' recorded producers reaches it. Independent of the lowering's vector clocks.
bool ordered_after(const StreamLowering& lowering, int64_t from, int64_t to) {
  std::vector<int64_t> producer_of_event(static_cast<size_t>(lowering.num_events), -1);
  for (const StreamOp& op : lowering.ops) {
    if (op.record_event >= 0)
      producer_of_event[static_cast<size_t>(op.record_event)] = op.instruction;
  }
  std::vector<bool> seen(lowering.ops.size(), false);
  std::vector<int64_t> stack = {from};
  while (!stack.empty()) {
    const int64_t at = stack.back();
    stack.pop_back();
    if (at == to) return true;
    if (seen[static_cast<size_t>(at)]) continue;
    seen[static_cast<size_t>(at)] = true;
    const StreamOp& op = lowering.ops[static_cast<size_t>(at)];
    for (int64_t previous = at - 1; previous >= 0; --previous) {  // stream predecessor
      if (lowering.ops[static_cast<size_t>(previous)].stream == op.stream) {
        stack.push_back(previous);
        break;
      }
    }
    for (int64_t event : op.wait_events)
      stack.push_back(producer_of_event[static_cast<size_t>(event)]);
  }
  return false;
}

void expect_valid(const RankProgram& program, const StreamLowering& lowering) {
  ASSERT_EQ(lowering.ops.size(), program.instructions.size());
  std::set<int64_t> recorded;
  int64_t waits = 0;
  for (size_t i = 0; i < lowering.ops.size(); ++i) {
    const StreamOp& op = lowering.ops[i];
    EXPECT_EQ(op.instruction, static_cast<int64_t>(i));
    // Every wait refers to an event recorded earlier in enqueue order.
    for (int64_t event : op.wait_events) {
      EXPECT_TRUE(recorded.count(event))
          << "instruction " << i << " waits on event " << event << " before it is recorded";
    }
    waits += static_cast<int64_t>(op.wait_events.size());
    if (op.record_event >= 0) {
      EXPECT_TRUE(recorded.insert(op.record_event).second) << "event recorded twice";
    }
    for (int64_t dep : program.instructions[i].deps) {
      EXPECT_TRUE(ordered_after(lowering, static_cast<int64_t>(i), dep))
          << "instruction " << i << " is not ordered after its dependency " << dep;
    }
  }
  EXPECT_EQ(waits, lowering.num_waits);
  EXPECT_EQ(static_cast<int64_t>(recorded.size()), lowering.num_events);
}

TEST(StreamLowering, StreamsAndPriorities) {
  EXPECT_EQ(stream_of(make("compute", {})), DeviceStream::kCompute);
  EXPECT_EQ(stream_of(make("local_comm", {}, InstructionKind::kCollective)),
            DeviceStream::kLocalComm);
  EXPECT_EQ(stream_of(make("cross_comm", {}, InstructionKind::kSend)), DeviceStream::kCrossComm);
  EXPECT_EQ(stream_of(make("cross_comm", {}, InstructionKind::kRecv)), DeviceStream::kReceive);
  EXPECT_FALSE(device_stream_high_priority(DeviceStream::kCompute));
  EXPECT_TRUE(device_stream_high_priority(DeviceStream::kLocalComm));
  EXPECT_TRUE(device_stream_high_priority(DeviceStream::kCrossComm));
  EXPECT_STREQ(device_stream_name(DeviceStream::kReceive), "receive");
  // An unknown stream name can no longer reach the lowering: the plan reader refuses it
  // (Instruction::stream is a StreamClass).
  EXPECT_FALSE(kStreamClassNames.parse("copy").has_value());
}

// A (compute), B (local, after A), C (compute, after B), D (compute, after A and C):
// B waits on A, C on B; D needs nothing (both on its own stream).
TEST(StreamLowering, SameStreamDependenciesNeedNoEvent) {
  const RankProgram program = program_of({make("compute", {}), make("local_comm", {0}),
                                          make("compute", {1}), make("compute", {0, 2})});
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  EXPECT_EQ(lowering.num_waits, 2);
  EXPECT_EQ(lowering.num_events, 2);
  EXPECT_EQ(lowering.ops[0].record_event, 0);
  EXPECT_EQ(lowering.ops[1].wait_events, std::vector<int64_t>{0});
  EXPECT_EQ(lowering.ops[1].record_event, 1);
  EXPECT_EQ(lowering.ops[2].wait_events, std::vector<int64_t>{1});
  EXPECT_TRUE(lowering.ops[3].wait_events.empty());
  EXPECT_EQ(lowering.deps_same_stream, 2);
}

// The header's example: C (cross, after A and B) waits only on B, which waited on A.
TEST(StreamLowering, TransitiveWaitIsDropped) {
  const RankProgram program =
      program_of({make("compute", {}), make("local_comm", {0}), make("cross_comm", {0, 1})});
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  EXPECT_EQ(lowering.num_waits, 2);
  EXPECT_EQ(lowering.ops[2].wait_events, std::vector<int64_t>{lowering.ops[1].record_event});
  EXPECT_EQ(lowering.deps_already_held, 1);
}

// A, B (compute); C (local, after B); D (local, after A): C's wait already orders the local
// stream after A, so D needs none. E (local, after A and B) neither.
TEST(StreamLowering, EarlierWaitCoversOlderProducers) {
  const RankProgram program =
      program_of({make("compute", {}), make("compute", {}), make("local_comm", {1}),
                  make("local_comm", {0}), make("local_comm", {0, 1})});
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  EXPECT_EQ(lowering.num_waits, 1);
  EXPECT_EQ(lowering.num_events, 1);
  EXPECT_EQ(lowering.ops[0].record_event, -1);  // never waited on: no event
}

// Only the latest dependency per producer stream needs a wait.
TEST(StreamLowering, OneWaitPerProducerStream) {
  const RankProgram program = program_of({make("compute", {}), make("compute", {}),
                                          make("compute", {}), make("cross_comm", {0, 2, 1})});
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  EXPECT_EQ(lowering.num_waits, 1);
  EXPECT_EQ(lowering.ops[3].wait_events, std::vector<int64_t>{lowering.ops[2].record_event});
}

// A diamond over three streams: D (compute) after B (local) and C (cross), both after A.
TEST(StreamLowering, DiamondNeedsBothBranches) {
  const RankProgram program = program_of({make("compute", {}), make("local_comm", {0}),
                                          make("cross_comm", {0}), make("compute", {1, 2})});
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  EXPECT_EQ(lowering.num_waits, 4);
  EXPECT_EQ(lowering.ops[3].wait_events.size(), 2u);
  EXPECT_EQ(lowering.num_events, 3);
}

TEST(StreamLowering, SequentialModeUsesOnlyTheComputeStream) {
  const RankProgram program = program_of({make("compute", {}), make("local_comm", {0}),
                                          make("cross_comm", {1}, InstructionKind::kRecv)},
                                         ExecutionMode::kSequential);
  const StreamLowering lowering = lower_to_streams(program);
  expect_valid(program, lowering);
  for (const StreamOp& op : lowering.ops) EXPECT_EQ(op.stream, DeviceStream::kCompute);
  EXPECT_EQ(lowering.num_waits, 0);
  EXPECT_EQ(lowering.num_events, 0);
}

// Every rank of every shipped tiny plan, both modes: each dependency holds by stream order
// or a wait, no wait precedes its record, and the lowering needs fewer waits than one per
// cross-stream dependency.
TEST(StreamLowering, ShippedTinyPlansAreFullyOrdered) {
  for (const std::string name : {"tiny-tp2-pp2", "tiny-dp2-tp2", "tiny-tp2"}) {
    const Plan plan =
        read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json");
    const JobSpec job = job_from_plan(plan, name);
    const int64_t world = job.parallel.dp * job.parallel.tp * job.parallel.pp * job.parallel.cp;
    for (int64_t rank = 0; rank < world; ++rank) {
      for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
        SCOPED_TRACE(name + " rank " + std::to_string(rank) + " " + execution_mode_name(mode));
        const RankProgram program = lower_rank_program(plan, job, rank, mode);
        const StreamLowering lowering = lower_to_streams(program);
        expect_valid(program, lowering);
        int64_t cross_stream = 0;
        for (size_t i = 0; i < program.instructions.size(); ++i) {
          for (int64_t dep : program.instructions[i].deps) {
            cross_stream += lowering.ops[static_cast<size_t>(dep)].stream != lowering.ops[i].stream;
          }
        }
        EXPECT_LE(lowering.num_waits, cross_stream);
        if (mode == ExecutionMode::kCoExecuted) {
          EXPECT_GT(lowering.num_waits, 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dhelix::cuda
