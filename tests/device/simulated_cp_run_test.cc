// Context parallelism on the CUDA path, on the recording fake device: every rank of the
// tiny CP 2 x TP 2 plan (examples/plans/tiny-cp2-tp2.json) set up as dhelix-run's CUDA engine
// sets up (model_comm_setup: the CP ring's communicators and the DP x CP gradient group),
// two iterations of the real executor over the real model wiring, both modes. What a GPU
// run needs of the ring so that it neither hangs nor mixes up data:
//   1. every ring step is one NCCL group (group start, a send to the next member, a receive
//      from the previous one, group end) on a CP communicator, never outside a group;
//   2. on every CP communicator, member a's sends to member b and b's receives from a agree
//      call for call in count and type (NCCL matches them in enqueue order): the members
//      run their steps on the same (dimension, stream) communicator in the same order;
//   3. as many ring steps as the program has CP collectives, and nothing but enqueueing
//      calls inside an iteration (no host wait);
//   4. the communicators include the ring's and the DP x CP group, and all are warmed
//      before iteration 1.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"
#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedCpRun : public ExampleRunSuite<SimulatedCpRun> {
 public:
  static constexpr const char* kExample = "tiny-cp2-tp2";
};

bool is_cp(const std::string& label) { return label.starts_with("cp ("); }

TEST_P(SimulatedCpRun, EveryRingStepIsOneGroupOnACpCommunicator) {
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t groups = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kGroupStart) {
        ASSERT_LT(i + 3, end);
        const DeviceCall& send = r.calls[i + 1];
        const DeviceCall& recv = r.calls[i + 2];
        EXPECT_EQ(send.kind, Kind::kSend) << "rank " << r.rank;
        EXPECT_EQ(recv.kind, Kind::kRecv) << "rank " << r.rank;
        EXPECT_EQ(r.calls[i + 3].kind, Kind::kGroupEnd) << "rank " << r.rank;
        EXPECT_TRUE(is_cp(labels.at(send.comm))) << labels.at(send.comm);
        EXPECT_EQ(send.comm, recv.comm);
        EXPECT_EQ(send.stream, recv.stream);
        // CP 2: the next member is the previous one.
        EXPECT_EQ(send.value, recv.value);
        EXPECT_GT(send.count, 0);
        ++groups;
      }
      if ((call.kind == Kind::kSend || call.kind == Kind::kRecv) && is_cp(labels.at(call.comm))) {
        ASSERT_GT(i, begin);
        const bool grouped = r.calls[i - 1].kind == Kind::kGroupStart ||
                             (r.calls[i - 1].kind == Kind::kSend && i >= 2 &&
                              r.calls[i - 2].kind == Kind::kGroupStart);
        EXPECT_TRUE(grouped) << "rank " << r.rank << ": a CP transfer outside a group";
      }
    }
    EXPECT_EQ(groups,
              2 * collectives_of(runs_->plan(), runs_->job(), r.rank, GetParam(), ParallelDim::kCp))
        << "rank " << r.rank;
  }
}

TEST_P(SimulatedCpRun, MembersSendsAndReceivesPairUpOnEveryCpCommunicator) {
  int64_t communicators = 0;
  for (const RankRecord& r : run()) {
    for (const auto& [comm, label] : comm_labels(r)) communicators += is_cp(label) ? 1 : 0;
  }
  EXPECT_EQ(communicators, 4 * 3);  // 4 ranks, the ring on 3 streams each
  const PointToPointCalls calls = point_to_point_calls(run(), is_cp);
  EXPECT_FALSE(calls.sent.empty());
  EXPECT_EQ(calls.sent, calls.received);
}

TEST_P(SimulatedCpRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

TEST_P(SimulatedCpRun, TheRingAndTheGradientGroupAreCreatedAndWarmedBeforeIteration1) {
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    int64_t cp = 0, gradient = 0;
    for (const auto& [comm, label] : labels) {
      cp += is_cp(label) ? 1 : 0;
      if (label.starts_with("dp x cp ranks ")) {
        ++gradient;
        EXPECT_EQ(members_of(label).size(), 2u) << label;  // dp 1 x cp 2
      }
    }
    EXPECT_EQ(cp, 3) << "rank " << r.rank;
    EXPECT_EQ(gradient, 1) << "rank " << r.rank;
    const size_t iteration = marker(r.calls, "iteration 1");
    std::set<int64_t> warmed;
    for (size_t i = 0; i < iteration; ++i) {
      const Kind kind = r.calls[i].kind;
      if (kind == Kind::kCollective || kind == Kind::kSend || kind == Kind::kRecv) {
        warmed.insert(r.calls[i].comm);
      }
    }
    for (const auto& [comm, label] : labels) {
      EXPECT_TRUE(warmed.contains(comm)) << "rank " << r.rank << ": " << label << " not warmed";
    }
    // The ring's communicators warmed with a ring step: NCCL connects point-to-point peers
    // apart from its collective rings, so an all-reduce would leave the connection for
    // iteration 1, with receives in flight (docs/gpu.md, "Review", point 1).
    for (const auto& [comm, label] : labels) {
      if (!is_cp(label)) continue;
      bool sent = false, received = false, grouped = false;
      for (size_t i = 0; i < iteration; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.comm != comm) continue;
        sent = sent || call.kind == Kind::kSend;
        received = received || call.kind == Kind::kRecv;
        EXPECT_NE(call.kind, Kind::kCollective) << label;
        grouped = grouped ||
                  (call.kind == Kind::kSend && i > 0 && r.calls[i - 1].kind == Kind::kGroupStart);
      }
      EXPECT_TRUE(sent && received && grouped) << "rank " << r.rank << ": " << label;
    }
  }
}

TEST_P(SimulatedCpRun, EveryGemmShapeIsWarmedAndNoSelfAttentionIsPrepared) {
  // Under CP the layers run the ring kernels, so the set-up prepares no attention path
  // (cuda_engine.cc); the GEMMs are the CP rank's shapes (seq / cp tokens per sequence).
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    std::set<GemmShape> warmed;
    for (size_t i = 0; i < iteration; ++i) {
      if (r.calls[i].kind == Kind::kWarmGemm) warmed.insert(r.calls[i].gemm);
      EXPECT_NE(r.calls[i].kind, Kind::kPrepareAttention) << "rank " << r.rank;
    }
    EXPECT_FALSE(r.attention.has_value());
    int64_t gemms = 0, ring_steps = 0;
    for (size_t i = iteration; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kKernel && call.label.starts_with("ring_forward_step")) ++ring_steps;
      if (call.kind != Kind::kGemm) continue;
      ++gemms;
      EXPECT_TRUE(warmed.contains(call.gemm))
          << "rank " << r.rank << ": GEMM m " << call.gemm.m << " n " << call.gemm.n << " k "
          << call.gemm.k << " not run at set-up";
    }
    EXPECT_GT(gemms, 0);
    EXPECT_GT(ring_steps, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedCpRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
