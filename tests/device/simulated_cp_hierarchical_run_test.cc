// Hierarchical context parallelism (cp_comm_type a2a+p2p) on the CUDA path, on the
// recording fake device: every rank of examples/plans/tiny-cp4-tp2-a2a-p2p.json (CP 4 =
// [2, 2] x TP 2 on 8 ranks, from examples/jobs/tiny-cp2-tp2-a2a.json) set up as
// dhelix-run's CUDA engine sets up (model_comm_setup: each CP level's communicators, as
// rt::ProcessGroups::cp_level splits them), two iterations of the real executor over the
// real model wiring (layer_ops_ulysses.h's a2a+p2p ops, layer_ops_cp.h's ring on the
// layer's view), both modes. What a GPU run needs so that it neither hangs nor mixes up data:
//   1. every CP op of the program is one NCCL group: an all-to-all (per peer the counts'
//      and the block's send and receive) on an a2a sub-group communicator, or a ring step
//      (one send, one receive) on a ring sub-group communicator; no CP transfer outside a
//      group and none on a communicator of the whole CP group;
//   2. on every sub-group communicator, member a's sends to b and b's receives from a agree
//      call for call in count and type;
//   3. each rank holds both levels' communicators on the three streams, each of 2 members,
//      warmed before iteration 1 (the a2a level with an all-to-all, the ring's with a ring
//      step);
//   4. nothing but enqueueing calls inside an iteration.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedCpHierarchicalRun : public ExampleRunSuite<SimulatedCpHierarchicalRun> {
 public:
  static constexpr const char* kExample = "tiny-cp4-tp2-a2a-p2p";
};

bool is_a2a(const std::string& label) { return label.starts_with("cp a2a ("); }
bool is_ring(const std::string& label) { return label.starts_with("cp ring ("); }

TEST_P(SimulatedCpHierarchicalRun, EveryCpOpIsOneGroupOnItsSubGroupsCommunicator) {
  const JobSpec& job = runs_->job();
  ASSERT_EQ(job.parallel.cp_comm_type, CpCommType::kA2aP2p);
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t all_to_alls = 0, ring_steps = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        const std::string& label = labels.at(call.comm);
        EXPECT_FALSE(label.starts_with("cp (")) << "rank " << r.rank << ": the whole CP group";
      }
      if (call.kind != Kind::kGroupStart) continue;
      ASSERT_LT(i + 3, end);
      const std::string& label = labels.at(r.calls[i + 1].comm);
      if (is_a2a(label)) {
        // Two members: one peer's counts, then its block.
        ASSERT_LT(i + 5, end);
        const std::vector<Kind> kinds = {r.calls[i + 1].kind, r.calls[i + 2].kind,
                                         r.calls[i + 3].kind, r.calls[i + 4].kind,
                                         r.calls[i + 5].kind};
        EXPECT_EQ(kinds, (std::vector<Kind>{Kind::kSend, Kind::kRecv, Kind::kSend, Kind::kRecv,
                                            Kind::kGroupEnd}))
            << "rank " << r.rank;
        EXPECT_EQ(r.calls[i + 1].dtype, DeviceDtype::kInt64);
        for (size_t k = i + 1; k <= i + 4; ++k) EXPECT_EQ(r.calls[k].comm, r.calls[i + 1].comm);
        ++all_to_alls;
      } else if (is_ring(label)) {
        EXPECT_EQ(r.calls[i + 1].kind, Kind::kSend);
        EXPECT_EQ(r.calls[i + 2].kind, Kind::kRecv);
        EXPECT_EQ(r.calls[i + 3].kind, Kind::kGroupEnd);
        EXPECT_EQ(r.calls[i + 1].comm, r.calls[i + 2].comm);
        ++ring_steps;
      }
    }
    EXPECT_GT(all_to_alls, 0) << "rank " << r.rank;
    EXPECT_GT(ring_steps, 0) << "rank " << r.rank;
    EXPECT_EQ(all_to_alls + ring_steps,
              2 * collectives_of(runs_->plan(), job, r.rank, GetParam(), ParallelDim::kCp))
        << "rank " << r.rank;
  }
}

TEST_P(SimulatedCpHierarchicalRun, MembersSendsAndReceivesPairUpOnEverySubGroup) {
  const PointToPointCalls calls = point_to_point_calls(
      run(), [](const std::string& label) { return is_a2a(label) || is_ring(label); },
      "iteration 1");
  EXPECT_FALSE(calls.sent.empty());
  EXPECT_EQ(calls.sent, calls.received);
}

TEST_P(SimulatedCpHierarchicalRun, BothLevelsAreCreatedAndWarmedBeforeIteration1) {
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    int64_t a2a = 0, ring = 0;
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_a2a(label) && !is_ring(label)) continue;
      (is_a2a(label) ? a2a : ring) += 1;
      EXPECT_EQ(members_of(label).size(), 2u) << label;
      bool counts = false, sent = false;
      for (size_t i = 1; i < iteration; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.comm != comm || call.kind != Kind::kSend) continue;
        sent = sent || r.calls[i - 1].kind == Kind::kGroupStart;
        counts = counts || call.dtype == DeviceDtype::kInt64;
      }
      EXPECT_TRUE(sent) << "rank " << r.rank << ": " << label << " not warmed";
      EXPECT_EQ(counts, is_a2a(label)) << "rank " << r.rank << ": " << label;
    }
    EXPECT_EQ(a2a, 3) << "rank " << r.rank;
    EXPECT_EQ(ring, 3) << "rank " << r.rank;
  }
}

TEST_P(SimulatedCpHierarchicalRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedCpHierarchicalRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
