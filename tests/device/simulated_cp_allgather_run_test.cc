// All-gather context parallelism (cp_comm_type allgather) on the CUDA path, on the
// recording fake device: every rank of examples/plans/tiny-cp2-tp2-allgather.json (CP 2 x
// TP 2 on 4 ranks, planned from examples/jobs/tiny-cp2-tp2-a2a.json with --cp-comm-type
// allgather) set up as dhelix-run's CUDA engine sets up, two iterations of the real executor
// over the real model wiring (runtime/model/layer_ops_kv_allgather.h), both modes. What a
// GPU run needs so that it neither hangs nor mixes up data:
//   1. every CP op of the program is one NCCL collective on a CP communicator: per layer
//      and micro-batch an all-gather of the K/V blocks in the forward, another in the
//      backward, a reduce-scatter of dK, dV, each of one member's block of 2 T kv elements
//      (NCCL's count: the all-gather's input, the reduce-scatter's output; cp of them make
//      the gathered buffer), and no ring step;
//   2. on every CP communicator the members enqueue the same collectives (op and count) in
//      the same order (NCCL matches collectives by order);
//   3. nothing but enqueueing calls inside an iteration (no host wait);
//   4. the CP communicators are warmed with all-gathers and reduce-scatters before
//      iteration 1, up to the iteration's count;
//   5. the attention runs the ring kernels over the gathered blocks: cp forward steps per
//      fwd.flash_attn, cp backward steps per bwd.flash_attn.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "lib/rank_shape.h"
#include "runtime/cuda/device_api.h"
#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedCpAllGatherRun : public ExampleRunSuite<SimulatedCpAllGatherRun> {
 public:
  static constexpr const char* kExample = "tiny-cp2-tp2-allgather";
};

bool is_cp(const std::string& label) { return label.starts_with("cp ("); }

// One member's block, [K | V] of a rank's T tokens at its KV-head width: the count of the
// all-gather and the reduce-scatter (NCCL's sendcount and recvcount).
int64_t block_elements(const JobSpec& job) {
  const RankShape d = rank_shape(job, 0);
  return 2 * d.tokens * d.kv_width;
}

// (op, count) of every CP collective of `r` between its markers `from` and `to`.
std::vector<std::pair<int64_t, std::string>> cp_collectives(const RankRecord& r, int64_t comm,
                                                            size_t from, size_t to) {
  std::vector<std::pair<int64_t, std::string>> calls;
  for (size_t i = from; i < to; ++i) {
    if (r.calls[i].kind == Kind::kCollective && r.calls[i].comm == comm) {
      calls.emplace_back(r.calls[i].value, r.calls[i].label);
    }
  }
  return calls;
}

TEST_P(SimulatedCpAllGatherRun, EveryCpOpIsOneGatherOrReduceScatterOfTheKvBlocks) {
  ASSERT_EQ(runs_->job().parallel.cp_comm_type, CpCommType::kAllGather);
  const std::string block = std::to_string(block_elements(runs_->job()));
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t gathers = 0, scatters = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        EXPECT_FALSE(is_cp(labels.at(call.comm))) << "rank " << r.rank << ": a CP ring step";
      }
      if (call.kind != Kind::kCollective || !is_cp(labels.at(call.comm))) continue;
      EXPECT_EQ(call.label, block) << "rank " << r.rank;
      if (call.value == static_cast<int64_t>(CollectiveOp::kAllGather)) ++gathers;
      if (call.value == static_cast<int64_t>(CollectiveOp::kReduceScatterSum)) ++scatters;
    }
    // Two iterations; per (layer, micro-batch) two gathers and one reduce-scatter.
    const int64_t per_iteration =
        collectives_of(runs_->plan(), runs_->job(), r.rank, GetParam(), ParallelDim::kCp);
    EXPECT_GT(per_iteration, 0);
    EXPECT_EQ(gathers + scatters, 2 * per_iteration) << "rank " << r.rank;
    EXPECT_EQ(gathers, 2 * scatters) << "rank " << r.rank;
  }
}

TEST_P(SimulatedCpAllGatherRun, MembersEnqueueTheSameCollectivesOnEveryCpCommunicator) {
  // label -> each member's (op, count) sequence over both iterations.
  std::map<std::string, std::vector<std::vector<std::pair<int64_t, std::string>>>> by_label;
  for (const RankRecord& r : run()) {
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    for (const auto& [comm, label] : comm_labels(r)) {
      if (is_cp(label)) by_label[label].push_back(cp_collectives(r, comm, begin, end));
    }
  }
  EXPECT_EQ(by_label.size(), 2u * 3);  // 2 CP groups (one per TP rank), 3 streams each
  int64_t used = 0;
  for (const auto& [label, members] : by_label) {
    ASSERT_EQ(members.size(), 2u) << label;
    EXPECT_EQ(members[0], members[1]) << label;
    used += members[0].empty() ? 0 : 1;
  }
  EXPECT_GT(used, 0);
}

TEST_P(SimulatedCpAllGatherRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

TEST_P(SimulatedCpAllGatherRun, CpCommunicatorsAreWarmedWithTheirCollectivesBeforeIteration1) {
  const std::string block = std::to_string(block_elements(runs_->job()));
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_cp(label)) continue;
      bool gather = false, scatter = false, largest = false;
      for (size_t i = 0; i < iteration; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.comm != comm) continue;
        EXPECT_NE(call.kind, Kind::kSend) << label << ": warmed with a ring step";
        if (call.kind != Kind::kCollective) continue;
        gather = gather || call.value == static_cast<int64_t>(CollectiveOp::kAllGather);
        scatter = scatter || call.value == static_cast<int64_t>(CollectiveOp::kReduceScatterSum);
        largest = largest || call.label == block;
      }
      EXPECT_TRUE(gather && scatter) << "rank " << r.rank << ": " << label;
      EXPECT_TRUE(largest) << "rank " << r.rank << ": " << label << " not warmed at " << block
                           << " elements";
    }
  }
}

TEST_P(SimulatedCpAllGatherRun, TheAttentionFoldsEveryGatheredBlockWithTheRingKernels) {
  const int64_t cp = runs_->job().parallel.cp;
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    int64_t starts = 0, forward_steps = 0, deltas = 0, backward_steps = 0;
    for (size_t i = iteration; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != Kind::kKernel) continue;
      starts += call.label.starts_with("ring_forward_start") ? 1 : 0;
      forward_steps += call.label.starts_with("ring_forward_step") ? 1 : 0;
      deltas += call.label.starts_with("ring_backward_delta") ? 1 : 0;
      backward_steps += call.label.starts_with("ring_backward_step") ? 1 : 0;
    }
    EXPECT_GT(starts, 0) << "rank " << r.rank;
    EXPECT_EQ(forward_steps, cp * starts) << "rank " << r.rank;
    EXPECT_EQ(deltas, starts) << "rank " << r.rank;
    EXPECT_EQ(backward_steps, cp * deltas) << "rank " << r.rank;
    EXPECT_FALSE(r.attention.has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedCpAllGatherRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
