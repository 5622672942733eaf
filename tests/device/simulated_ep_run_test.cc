// MoE with expert parallelism on the CUDA path, on the recording fake device: both ranks of
// the tiny EP 2 plan (examples/plans/tiny-moe-ep2.json: dp 2 = ep 2, 4 experts, top-2) set
// up as dhelix-run's CUDA engine sets up (model_comm_setup: the EP group's communicators
// and the expert-data-parallel group), two iterations of the real executor over the real
// model wiring (runtime/model/moe_layers_padded.h on RecordingBackend), both modes. What a
// GPU run needs of the dispatch and combine so that it neither hangs nor mixes up data:
//   1. every all-to-all is the padded one of DeviceCommunicator::all_to_all_v: this rank's
//      own counts and block as two device copies, then one NCCL group holding, per peer,
//      the counts' send and receive and the block's send and receive, on an EP
//      communicator; as many groups as the program has EP collectives;
//   2. on every EP communicator, member a's sends to b and b's receives from a agree call
//      for call in count and type (NCCL matches them in enqueue order);
//   3. nothing but enqueueing calls inside an iteration (no host wait: the counts never
//      come back to the host);
//   4. the EP communicators and the expert-data-parallel group exist and are warmed before
//      iteration 1, the EP ones with a grouped send and receive; every GEMM shape the
//      iteration runs (the router's, the experts' on padded rows) is warmed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"
#include "lib/rank_shape.h"
#include "runtime/kernels/moe_capacity.h"
#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedEpRun : public ExampleRunSuite<SimulatedEpRun> {
 public:
  static constexpr const char* kExample = "tiny-moe-ep2";
};

bool is_ep(const std::string& label) { return label.starts_with("ep ("); }

// One member's block of the padded all-to-all: L local experts x C rows x h
// (runtime/kernels/moe_padded.h), C = ceil(cf T k / E) of the rank's T rows.
int64_t block_elements(const JobSpec& job, int64_t rank) {
  const MoeSpec& moe = *job.model.moe;
  const RankShape d = rank_shape(job, rank);
  const int64_t capacity =
      kernels::expert_capacity(d.rows, moe.top_k, moe.num_experts, moe.capacity_factor);
  return moe.num_experts / job.parallel.ep * capacity * d.hidden;
}

TEST_P(SimulatedEpRun, EveryAllToAllIsTwoCopiesAndOneGroupOnAnEpCommunicator) {
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t groups = 0;
    for (size_t i = begin; i < end; ++i) {
      if (r.calls[i].kind != Kind::kGroupStart) continue;
      ASSERT_LT(i + 5, end);
      ASSERT_GE(i, begin + 2);
      // ep = 2: one peer. Own counts and own block copied first, on the group's stream.
      const DeviceCall& counts_send = r.calls[i + 1];
      EXPECT_EQ(r.calls[i - 2].kind, Kind::kCopy) << "rank " << r.rank;
      EXPECT_EQ(r.calls[i - 1].kind, Kind::kCopy) << "rank " << r.rank;
      EXPECT_EQ(r.calls[i - 1].stream, counts_send.stream);
      EXPECT_EQ(counts_send.kind, Kind::kSend);
      EXPECT_EQ(r.calls[i + 2].kind, Kind::kRecv);
      EXPECT_EQ(r.calls[i + 3].kind, Kind::kSend);
      EXPECT_EQ(r.calls[i + 4].kind, Kind::kRecv);
      EXPECT_EQ(r.calls[i + 5].kind, Kind::kGroupEnd);
      EXPECT_TRUE(is_ep(labels.at(counts_send.comm))) << labels.at(counts_send.comm);
      // The counts: L = 2 int64 per member; the block: L C h elements.
      EXPECT_EQ(counts_send.count, 2);
      EXPECT_EQ(r.calls[i + 3].count, block_elements(runs_->job(), r.rank));
      EXPECT_EQ(r.calls[i + 4].count, block_elements(runs_->job(), r.rank));
      for (size_t j = i + 1; j <= i + 4; ++j) {
        EXPECT_EQ(r.calls[j].comm, counts_send.comm);
        EXPECT_EQ(r.calls[j].value, 1 - r.rank);  // the other member (ranks 0, 1)
      }
      ++groups;
    }
    // Two iterations.
    EXPECT_EQ(groups,
              2 * collectives_of(runs_->plan(), runs_->job(), r.rank, GetParam(), ParallelDim::kEp))
        << "rank " << r.rank;
    EXPECT_GT(groups, 0);
  }
}

TEST_P(SimulatedEpRun, MembersSendsAndReceivesPairUpOnEveryEpCommunicator) {
  int64_t communicators = 0;
  for (const RankRecord& r : run()) {
    for (const auto& [comm, label] : comm_labels(r)) communicators += is_ep(label) ? 1 : 0;
  }
  EXPECT_EQ(communicators, 2 * 3);  // 2 ranks, the EP group on 3 streams each
  const PointToPointCalls calls = point_to_point_calls(run(), is_ep);
  EXPECT_FALSE(calls.sent.empty());
  EXPECT_EQ(calls.sent, calls.received);
}

TEST_P(SimulatedEpRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

TEST_P(SimulatedEpRun, EpAndExpertGroupsAreWarmedAndEveryGemmShapeIsWarmed) {
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    int64_t ep = 0, expert = 0;
    for (const auto& [comm, label] : labels) {
      ep += is_ep(label) ? 1 : 0;
      expert += label.starts_with("expert dp ranks ") ? 1 : 0;
    }
    EXPECT_EQ(ep, 3) << "rank " << r.rank;
    // The expert-data-parallel group, dp 2 / ep 2 = one member, has no NCCL communicator
    // (nccl_communicator.h: a group of one).
    EXPECT_EQ(expert, 0) << "rank " << r.rank;
    const size_t iteration = marker(r.calls, "iteration 1");
    std::set<int64_t> warmed;
    std::set<GemmShape> gemms;
    for (size_t i = 0; i < iteration; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kCollective || call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        warmed.insert(call.comm);
      }
      if (call.kind == Kind::kWarmGemm) gemms.insert(call.gemm);
    }
    for (const auto& [comm, label] : labels) {
      EXPECT_TRUE(warmed.contains(comm)) << "rank " << r.rank << ": " << label << " not warmed";
      if (!is_ep(label)) continue;
      bool grouped = false;
      for (size_t i = 1; i < iteration; ++i) {
        grouped = grouped || (r.calls[i].comm == comm && r.calls[i].kind == Kind::kSend &&
                              r.calls[i - 1].kind == Kind::kGroupStart);
        EXPECT_FALSE(r.calls[i].comm == comm && r.calls[i].kind == Kind::kCollective) << label;
      }
      EXPECT_TRUE(grouped) << "rank " << r.rank << ": " << label << " not warmed point to point";
    }
    int64_t routes = 0, iteration_gemms = 0;
    for (size_t i = iteration; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kKernel && call.label == "moe_route") ++routes;
      if (call.kind != Kind::kGemm) continue;
      ++iteration_gemms;
      EXPECT_TRUE(gemms.contains(call.gemm))
          << "rank " << r.rank << ": GEMM m " << call.gemm.m << " n " << call.gemm.n << " k "
          << call.gemm.k << " not run at set-up";
    }
    EXPECT_GT(routes, 0);
    EXPECT_GT(iteration_gemms, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedEpRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
