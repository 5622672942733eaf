// The CUDA executor's pipeline-channel agreement (runtime/cuda/channel_agreement.h) under
// mpirun -np 4 on tiny-tp2-pp2 (stage 0 = ranks 0, 1; stage 1 = ranks 2, 3): the world's
// channel order, the pair communicators, the senders' orders kept by the receivers, and a
// message no receive matches, refused on every rank.

#include "runtime/cuda/channel_agreement.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "runtime/train/setup_failure.h"

namespace dhelix::cuda {
namespace {

struct Loaded {
  Plan plan;
  JobSpec job;
};

const Loaded& tiny_tp2_pp2() {
  static const Loaded loaded = [] {
    Loaded l{read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json"), {}};
    l.job = job_from_plan(l.plan, "tiny-tp2-pp2");
    return l;
  }();
  return loaded;
}

int64_t my_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::vector<int64_t> sent_tags(const RankProgram& program, int64_t to) {
  std::vector<int64_t> tags;
  for (const Instruction& i : program.instructions) {
    if (i.kind == InstructionKind::kSend && i.peer == to) tags.push_back(i.tag);
  }
  return tags;
}

TEST(ChannelAgreement, TinyTp2Pp2AgreesAndKeepsTheSendersOrders) {
  const Loaded& l = tiny_tp2_pp2();
  const int64_t rank = my_rank();
  const int64_t peer = (rank + 2) % 4;
  const RankProgram co = lower_rank_program(l.plan, l.job, rank, ExecutionMode::kCoExecuted);
  const RankProgram seq = lower_rank_program(l.plan, l.job, rank, ExecutionMode::kSequential);
  ChannelAgreement agreement({&co, &seq}, rank, l.job.model.num_layers);
  const std::vector<ChannelPair> expected = {{0, 2}, {1, 3}, {2, 0}, {3, 1}};
  ASSERT_EQ(agreement.channels(), expected);
  for (size_t i = 0; i < expected.size(); ++i) {
    const bool member = expected[i].sender == rank || expected[i].receiver == rank;
    ASSERT_EQ(agreement.communicator(i) != MPI_COMM_NULL, member) << i;
    if (!member) continue;
    int size = 0;
    int me = 0;
    MPI_Comm_size(agreement.communicator(i), &size);
    MPI_Comm_rank(agreement.communicator(i), &me);
    EXPECT_EQ(size, 2);
    EXPECT_EQ(me, expected[i].sender == rank ? 0 : 1);
  }
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const ReceiveOrders& orders = agreement.receive_orders().at(mode);
    ASSERT_EQ(orders.size(), 1u);
    const RankProgram sender = lower_rank_program(l.plan, l.job, peer, mode);
    EXPECT_EQ(orders.at(peer), sent_tags(sender, rank)) << execution_mode_name(mode);
  }
  if (rank == 2) {  // rank 0 sends mb 0's gradient (7) before mb 2's activation (28)
    const std::vector<int64_t>& order =
        agreement.receive_orders().at(ExecutionMode::kCoExecuted).at(0);
    EXPECT_EQ(std::vector<int64_t>(order.begin(), order.begin() + 4),
              (std::vector<int64_t>{4, 16, 7, 28}));
  }
  agreement.release_communicators();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(agreement.communicator(i), MPI_COMM_NULL);
}

TEST(ChannelAgreement, AMessageNeverReceivedIsRefusedOnEveryRank) {
  const Loaded& l = tiny_tp2_pp2();
  const int64_t rank = my_rank();
  RankProgram program = lower_rank_program(l.plan, l.job, rank, ExecutionMode::kCoExecuted);
  if (rank == 2) {  // its last receive from rank 0 (tag 43) is dropped
    for (auto it = program.instructions.rbegin(); it != program.instructions.rend(); ++it) {
      if (it->kind != InstructionKind::kRecv || it->peer != 0) continue;
      ASSERT_EQ(it->tag, 43);
      it->kind = InstructionKind::kCompute;
      break;
    }
  }
  const std::string what =
      rank == 0 || rank == 2
          ? "pipeline channel 0 -> 2: tag 43 (micro-batch 3, gradient of layer 2's output) is "
            "sent 1 time but received 0 times"
          : "the pipeline channels of another rank disagree (its error names the channel)";
  try {
    ChannelAgreement agreement({&program}, rank, l.job.model.num_layers);
    FAIL() << "rank " << rank << ": the missing receive was accepted";
  } catch (const rt::SetupFailure& error) {  // agreed: every rank ends normally
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_EQ(std::string(error.what()),
              "rank " + std::to_string(rank) + ", co-executed program: " + what +
                  "; a message sent and never received (or the reverse) would hang NCCL");
  }
}

}  // namespace
}  // namespace dhelix::cuda
