// Ulysses context parallelism (cp_comm_type a2a) on the CUDA path, on the recording fake
// device: every rank of examples/plans/tiny-cp2-tp2-a2a.json (CP 2 x TP 2 on 4 ranks, from
// examples/jobs/tiny-cp2-tp2-a2a.json) set up as dhelix-run's CUDA engine sets up, two
// iterations of the real executor over the real model wiring (runtime/model/
// layer_ops_ulysses.h: the packing as B::copy_strided, the all-to-alls as the device's
// padded all_to_all_v with counts made at bind), both modes. What a GPU run needs so that it
// neither hangs nor mixes up data:
//   1. every CP op of the program is one NCCL group on a CP communicator: per peer the
//      counts' send and receive (one int64 each) and the block's (T x width / cp elements,
//      width the fused QKV's for qkv_a2a and dqkv_a2a, the query's for out_a2a and
//      dout_a2a), nothing outside a group;
//   2. on every CP communicator, member a's sends to b and b's receives from a agree call
//      for call in count and type (NCCL matches them in enqueue order);
//   3. nothing but enqueueing calls inside an iteration (no host wait);
//   4. the CP communicators are warmed with a grouped all-to-all before iteration 1;
//   5. the attention is the cp = 1 kernel over the whole sequence on heads / cp, and the
//      packing runs as strided device copies, never on the host.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/rank_shape.h"
#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedCpA2aRun : public ExampleRunSuite<SimulatedCpA2aRun> {
 public:
  static constexpr const char* kExample = "tiny-cp2-tp2-a2a";
};

bool is_cp(const std::string& label) { return label.starts_with("cp ("); }

TEST_P(SimulatedCpA2aRun, EveryCpOpIsOneGroupedAllToAllOnACpCommunicator) {
  const JobSpec& job = runs_->job();
  ASSERT_EQ(job.parallel.cp_comm_type, CpCommType::kA2a);
  ASSERT_EQ(job.parallel.cp, 2);
  const RankShape d = rank_shape(job, 0);
  const std::set<int64_t> blocks = {d.tokens * d.qkv_width / 2, d.tokens * d.q_width / 2};
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t groups = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kGroupStart) {
        // CP 2: one peer; its counts' send and receive, then its block's.
        ASSERT_LT(i + 5, end);
        const std::vector<Kind> kinds = {r.calls[i + 1].kind, r.calls[i + 2].kind,
                                         r.calls[i + 3].kind, r.calls[i + 4].kind,
                                         r.calls[i + 5].kind};
        if (!is_cp(labels.at(r.calls[i + 1].comm))) continue;
        EXPECT_EQ(kinds, (std::vector<Kind>{Kind::kSend, Kind::kRecv, Kind::kSend, Kind::kRecv,
                                            Kind::kGroupEnd}))
            << "rank " << r.rank;
        EXPECT_EQ(r.calls[i + 1].count, 1);
        EXPECT_EQ(r.calls[i + 1].dtype, DeviceDtype::kInt64);
        EXPECT_TRUE(blocks.contains(r.calls[i + 3].count)) << r.calls[i + 3].count;
        EXPECT_EQ(r.calls[i + 3].count, r.calls[i + 4].count);
        for (size_t k = i + 1; k <= i + 4; ++k) {
          EXPECT_EQ(r.calls[k].comm, r.calls[i + 1].comm);
          EXPECT_EQ(r.calls[k].stream, r.calls[i + 1].stream);
        }
        ++groups;
      }
      if ((call.kind == Kind::kSend || call.kind == Kind::kRecv) && is_cp(labels.at(call.comm))) {
        size_t j = i;
        while (j > begin && r.calls[j].kind != Kind::kGroupStart &&
               r.calls[j].kind != Kind::kGroupEnd) {
          --j;
        }
        EXPECT_EQ(r.calls[j].kind, Kind::kGroupStart)
            << "rank " << r.rank << ": a CP transfer outside a group";
      }
    }
    EXPECT_EQ(groups, 2 * collectives_of(runs_->plan(), job, r.rank, GetParam(), ParallelDim::kCp))
        << "rank " << r.rank;
  }
}

TEST_P(SimulatedCpA2aRun, MembersSendsAndReceivesPairUpOnEveryCpCommunicator) {
  const PointToPointCalls calls = point_to_point_calls(run(), is_cp, "iteration 1");
  EXPECT_FALSE(calls.sent.empty());
  EXPECT_EQ(calls.sent, calls.received);
}

TEST_P(SimulatedCpA2aRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

TEST_P(SimulatedCpA2aRun, CpCommunicatorsAreWarmedWithAGroupedAllToAllBeforeIteration1) {
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    int64_t cp = 0;
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_cp(label)) continue;
      ++cp;
      bool counts = false, block = false;
      for (size_t i = 1; i < iteration; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.comm != comm) continue;
        EXPECT_NE(call.kind, Kind::kCollective) << label;
        if (call.kind != Kind::kSend) continue;
        counts = counts || call.dtype == DeviceDtype::kInt64;
        block = block || call.dtype == DeviceDtype::kBFloat16;
      }
      EXPECT_TRUE(counts && block) << "rank " << r.rank << ": " << label;
    }
    EXPECT_EQ(cp, 3) << "rank " << r.rank;  // compute, local and cross streams
  }
}

TEST_P(SimulatedCpA2aRun, TheAttentionRunsOnTheWholeSequenceOfHeadsOverCp) {
  const JobSpec& job = runs_->job();
  const RankShape d = rank_shape(job, 0);
  const int64_t cp = job.parallel.cp;
  const std::string shape =
      fmt::format("batch {} seq {} heads {} kv_heads {} head_dim {}", d.micro_batch,
                  d.seq_shard * cp, d.heads / cp, d.kv_heads / cp, d.head_dim);
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    int64_t forward = 0, backward = 0, copies = 0;
    for (size_t i = iteration; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != Kind::kKernel) continue;
      if (call.label.starts_with("attention_forward")) {
        EXPECT_EQ(call.label, "attention_forward " + shape);
        ++forward;
      }
      if (call.label.starts_with("attention_backward")) {
        EXPECT_EQ(call.label, "attention_backward " + shape);
        ++backward;
      }
      EXPECT_FALSE(call.label.starts_with("ring_")) << call.label;
      copies += call.label == "copy_strided" ? 1 : 0;
    }
    EXPECT_GT(forward, 0) << "rank " << r.rank;
    EXPECT_EQ(forward, backward) << "rank " << r.rank;
    EXPECT_GT(copies, 0) << "rank " << r.rank;
  }
}

// Ulysses' attention is plain causal attention on the head split, so the set-up prepares
// it (cuDNN or dhelix's kernel, self-checked) before the first receive, on that shape.
TEST_P(SimulatedCpA2aRun, TheHeadSplitAttentionIsPreparedBeforeTheFirstReceive) {
  const JobSpec& job = runs_->job();
  const RankShape d = rank_shape(job, 0);
  const int64_t cp = job.parallel.cp;
  const std::string shape =
      fmt::format("batch {} seq {} heads {} kv_heads {} head_dim {}", d.micro_batch,
                  d.seq_shard * cp, d.heads / cp, d.kv_heads / cp, d.head_dim);
  for (const RankRecord& r : run()) {
    const auto prepared = std::find_if(r.calls.begin(), r.calls.end(), [](const DeviceCall& c) {
      return c.kind == Kind::kPrepareAttention;
    });
    ASSERT_NE(prepared, r.calls.end()) << "rank " << r.rank;
    EXPECT_EQ(prepared->label, shape) << "rank " << r.rank;
    const auto first_recv = std::find_if(r.calls.begin(), r.calls.end(),
                                         [](const DeviceCall& c) { return c.kind == Kind::kRecv; });
    EXPECT_LT(prepared, first_recv) << "rank " << r.rank;
    EXPECT_TRUE(r.attention.has_value()) << "rank " << r.rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedCpA2aRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
