#include "runtime/cuda/device_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix::cuda {
namespace {

Instruction make(InstructionKind kind, const std::string& stream, std::vector<int64_t> deps,
                 int64_t peer = -1) {
  Instruction instruction;
  instruction.kind = kind;
  instruction.op = "op";
  instruction.stream = kStreamClassNames.parse(stream).value();
  instruction.peer = peer;
  instruction.deps = std::move(deps);
  return instruction;
}

RankProgram hand_program(ExecutionMode mode) {
  RankProgram program;
  program.mode = mode;
  program.instructions = {
      make(InstructionKind::kCompute, "compute", {}),
      make(InstructionKind::kRecv, "cross_comm", {0}, 5),
      make(InstructionKind::kCompute, "compute", {1}),
      make(InstructionKind::kSend, "cross_comm", {2}, 5),
      make(InstructionKind::kRecv, "cross_comm", {}, 7),
      make(InstructionKind::kCollective, "local_comm", {4}),
  };
  return program;
}

TEST(DeviceSchedule, CoExecutedPostsReceivesAfterTheLoweringsEventsAndJoinsStreams) {
  const DeviceSchedule s = schedule_device_program(hand_program(ExecutionMode::kCoExecuted));
  // Lowering: op 0 records 0 (for the receive 1), op 1 records 1 (for 2), op 2 records 2
  // (for the send 3), op 4 records 3 (for the collective 5).
  ASSERT_EQ(s.lowering.num_events, 4);
  EXPECT_EQ(s.lowering.ops[1].stream, DeviceStream::kReceive);
  EXPECT_EQ(s.lowering.ops[1].wait_events, (std::vector<int64_t>{0}));
  ASSERT_EQ(s.receives.size(), 2u);
  EXPECT_EQ(s.receives[0].instruction, 1);
  EXPECT_EQ(s.receives[0].peer, 5);
  EXPECT_EQ(s.receives[0].event, 4);
  EXPECT_EQ(s.receives[1].instruction, 4);
  EXPECT_EQ(s.receives[1].peer, 7);
  EXPECT_EQ(s.receives[1].event, 5);
  EXPECT_EQ(s.receive_event, (std::vector<int64_t>{-1, 4, -1, -1, 5, -1}));
  EXPECT_EQ(s.join_streams,
            (std::vector<DeviceStream>{DeviceStream::kLocalComm, DeviceStream::kCrossComm,
                                       DeviceStream::kReceive}));
  EXPECT_EQ(s.join_events, (std::vector<int64_t>{6, 7, 8}));
  EXPECT_EQ(s.num_events, 9);
}

TEST(DeviceSchedule, SequentialRunsOnComputeWithReceiveEventsOnly) {
  const DeviceSchedule s = schedule_device_program(hand_program(ExecutionMode::kSequential));
  EXPECT_EQ(s.lowering.num_events, 0);
  for (const StreamOp& op : s.lowering.ops) EXPECT_EQ(op.stream, DeviceStream::kCompute);
  EXPECT_EQ(s.receive_event, (std::vector<int64_t>{-1, 0, -1, -1, 1, -1}));
  EXPECT_TRUE(s.join_streams.empty());
  EXPECT_EQ(s.num_events, 2);
}

TEST(DeviceSchedule, WithoutSendOrdersReceivesArePostedInProgramOrder) {
  const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json";
  const Plan plan = read_plan(path);
  const JobSpec job = job_from_plan(plan, "tiny-tp2-pp2");
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const RankProgram program = lower_rank_program(plan, job, 0, mode);
    const DeviceSchedule s = schedule_device_program(program);
    ASSERT_EQ(s.receives.size(), 8u) << execution_mode_name(mode);
    int64_t previous = -1;
    for (size_t r = 0; r < s.receives.size(); ++r) {
      EXPECT_EQ(s.receives[r].peer, 2);  // rank 0's TP partner in stage 1
      EXPECT_GT(s.receives[r].instruction, previous);
      EXPECT_EQ(s.receives[r].event, s.lowering.num_events + static_cast<int64_t>(r));
      previous = s.receives[r].instruction;
    }
    EXPECT_EQ(s.join_streams.empty(), mode == ExecutionMode::kSequential);
  }
}

// Rank 2 of tiny-tp2-pp2 receives from rank 0 in another order than rank 0 sends: the
// receives are posted in rank 0's order.
TEST(DeviceSchedule, ReceivesArePostedInTheSendersOrder) {
  const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json";
  const Plan plan = read_plan(path);
  const JobSpec job = job_from_plan(plan, "tiny-tp2-pp2");
  const RankProgram sender = lower_rank_program(plan, job, 0, ExecutionMode::kCoExecuted);
  const RankProgram receiver = lower_rank_program(plan, job, 2, ExecutionMode::kCoExecuted);
  std::vector<int64_t> sent;
  for (const Instruction& i : sender.instructions) {
    if (i.kind == InstructionKind::kSend && i.peer == 2) sent.push_back(i.tag);
  }
  // L = 4: mb 0 and 1 into layer 1 (tags 4, 16), then mb 0's gradient of layer 2's output
  // (7) before mb 2 into layer 1 (28).
  ASSERT_EQ(sent.size(), 8u);
  EXPECT_EQ((std::vector<int64_t>(sent.begin(), sent.begin() + 4)),
            (std::vector<int64_t>{4, 16, 7, 28}));
  const DeviceSchedule s = schedule_device_program(receiver, {{0, sent}});
  std::vector<int64_t> posted;
  for (const PostedReceive& r : s.receives) {
    posted.push_back(receiver.instructions[static_cast<size_t>(r.instruction)].tag);
  }
  EXPECT_EQ(posted, sent);
  std::vector<int64_t> program_order;
  for (const Instruction& i : receiver.instructions) {
    if (i.kind == InstructionKind::kRecv) program_order.push_back(i.tag);
  }
  // Posting follows the sender's order, not the program's: with two messages swapped on the
  // sender the receives are posted swapped too.
  std::vector<int64_t> swapped = sent;
  std::swap(swapped[1], swapped[2]);
  ASSERT_NE(program_order, swapped);
  posted.clear();
  for (const PostedReceive& r : schedule_device_program(receiver, {{0, swapped}}).receives) {
    posted.push_back(receiver.instructions[static_cast<size_t>(r.instruction)].tag);
  }
  EXPECT_EQ(posted, swapped);
  std::vector<int64_t> short_list(sent.begin(), sent.end() - 1);
  try {
    schedule_device_program(receiver, {{0, short_list}});
    FAIL() << "a send order missing a message was accepted";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "rank 2: the send order of rank 0 (7 messages) does not hold the 8 messages "
                 "this program receives from it");
  }
}

TEST(DeviceSchedule, DtypeOfElementType) {
  EXPECT_EQ(device_dtype_of(rt::ElementType::kFloat32), DeviceDtype::kFloat32);
  EXPECT_EQ(device_dtype_of(rt::ElementType::kBFloat16), DeviceDtype::kBFloat16);
}

}  // namespace
}  // namespace dhelix::cuda
