// Fully sharded data parallelism (Megatron-FSDP's optim_grads_params) on the CUDA path, on
// the recording fake device: every rank of examples/jobs/tiny-fsdp-dp4.json (DP 4 on 4
// ranks, planned in process as dhelix-plan plans it) set up as dhelix-run's CUDA engine sets
// up, two iterations of the real executor over the real model wiring
// (runtime/model/fsdp_layers.h), both modes. What a GPU run needs so that it neither hangs
// nor mixes up data:
//   1. every FSDP op of the program is one NCCL collective on a DP communicator of its
//      stream: fwd/bwd.fsdp_gather an all-gather, bwd.fsdp_reduce_scatter a
//      reduce-scatter, each of one layer's shard s (NCCL's count: the gather's input, the
//      reduce-scatter's output; dp of them make the padded whole);
//   2. on every DP communicator the members enqueue the same collectives (op and count) in
//      the same order (NCCL matches collectives by order);
//   3. every gathered buffer is released (filled with all-ones on its op's stream) and
//      every whole gradient zeroed before its first writer, once per (micro-batch, layer):
//      the reduce-scatter's release right after it on its own stream;
//   4. after each iteration the reduced shards are summed on the compute stream, one sum
//      per (micro-batch, layer), in micro-batch order;
//   5. nothing but enqueueing calls inside an iteration (no host wait), and the DP
//      communicators warmed with gathers and reduce-scatters up to s before iteration 1;
//   6. with the gradient reduction, the other parameters (embedding, final norm, head) are
//      summed over the gradient group apart from FSDP's communicators, and the shards are
//      in no bucket;
//   7. with DP 2 x TP 2 and sequence parallelism, each TP rank's shards go over its own DP
//      group, the members' calls equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/job_reader.h"
#include "lib/plan/plan_job.h"
#include "runtime/cuda/device_api.h"
#include "runtime/model/stage_model.h"
#include "tests/device/example_runs.h"
#include "tests/device/plan_in_process.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

bool is_fsdp_comm(const std::string& label) { return label.starts_with("dp ("); }

// The example planned once; its runs once per mode.
struct FsdpExample {
  Plan plan;
  JobSpec job;
  std::map<ExecutionMode, std::vector<RankRecord>> runs;
};

class SimulatedFsdpRun : public ::testing::TestWithParam<ExecutionMode> {
 protected:
  static void SetUpTestSuite() {
    const JobSpec job =
        read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-fsdp-dp4.json");
    Plan plan = plan_in_process(job, "tiny-fsdp-dp4.json");
    JobSpec planned = job_from_plan(plan, "tiny-fsdp-dp4.json");
    example_ = new FsdpExample{std::move(plan), std::move(planned), {}};
  }
  static void TearDownTestSuite() {
    delete example_;
    example_ = nullptr;
  }
  const Plan& plan() const { return example_->plan; }
  const JobSpec& job() const { return example_->job; }
  const std::vector<RankRecord>& run() {
    auto it = example_->runs.find(GetParam());
    if (it == example_->runs.end()) {
      it = example_->runs.emplace(GetParam(), simulate_run(plan(), job(), GetParam(), 2)).first;
    }
    return it->second;
  }
  // One layer's shard s and padded whole on `rank` (every layer of tiny-fsdp-dp4 is alike),
  // from the CPU model's layout: the same code shards both backends' layers.
  int64_t shard_elements(int64_t rank) const {
    rt::StageModel model(job(), rank, {{0, job().model.num_layers}}, true, true, 7, {},
                         {.enabled = true});
    const rt::FsdpLayout* layout = model.fsdp_layout("layers.0.fsdp_shard");
    EXPECT_NE(layout, nullptr);
    return layout == nullptr ? 0 : layout->shard();
  }
  int64_t micro_batches() const {
    const ParallelSpec& p = job().parallel;
    return p.global_batch_size / (p.micro_batch_size * p.dp);
  }
  static inline FsdpExample* example_ = nullptr;
};

TEST_P(SimulatedFsdpRun, EveryFsdpOpIsOneDpCollectiveOfTheLayersShard) {
  ASSERT_TRUE(job().parallel.fsdp_shards_parameters());
  ASSERT_EQ(job().parallel.dp, 4);
  for (const RankRecord& r : run()) {
    const std::string shard = std::to_string(shard_elements(r.rank));
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    ASSERT_LT(begin, end);
    int64_t gathers = 0, scatters = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != Kind::kCollective || !is_fsdp_comm(labels.at(call.comm))) continue;
      EXPECT_EQ(call.label, shard) << "rank " << r.rank;
      if (call.value == static_cast<int64_t>(CollectiveOp::kAllGather)) ++gathers;
      if (call.value == static_cast<int64_t>(CollectiveOp::kReduceScatterSum)) ++scatters;
    }
    // Two iterations of the program's DP collectives; per (layer, micro-batch) with
    // reshard_after_forward two gathers (forward, backward) and one reduce-scatter.
    const int64_t per_iteration =
        collectives_of(plan(), job(), r.rank, GetParam(), ParallelDim::kDp);
    const int64_t layer_micro_batches = job().model.num_layers * micro_batches();
    EXPECT_EQ(per_iteration, 3 * layer_micro_batches) << "rank " << r.rank;
    EXPECT_EQ(gathers, 2 * 2 * layer_micro_batches) << "rank " << r.rank;
    EXPECT_EQ(scatters, 2 * layer_micro_batches) << "rank " << r.rank;
  }
}

TEST_P(SimulatedFsdpRun, MembersEnqueueTheSameCollectivesOnEveryDpCommunicator) {
  // label -> each member's (op, count) sequence over both iterations.
  std::map<std::string, std::vector<std::vector<std::pair<int64_t, std::string>>>> by_label;
  for (const RankRecord& r : run()) {
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_fsdp_comm(label)) continue;
      std::vector<std::pair<int64_t, std::string>>& calls = by_label[label].emplace_back();
      for (size_t i = begin; i < end; ++i) {
        if (r.calls[i].kind == Kind::kCollective && r.calls[i].comm == comm) {
          calls.emplace_back(r.calls[i].value, r.calls[i].label);
        }
      }
    }
  }
  EXPECT_EQ(by_label.size(), 3u);  // one DP group of 4, on 3 streams
  int64_t used = 0;
  for (const auto& [label, members] : by_label) {
    ASSERT_EQ(members.size(), 4u) << label;
    for (size_t m = 1; m < members.size(); ++m) EXPECT_EQ(members[m], members[0]) << label;
    used += members[0].empty() ? 0 : 1;
  }
  // Sequential programs run every op on the compute stream; co-executed ones spread them.
  EXPECT_GE(used, 1);
}

TEST_P(SimulatedFsdpRun, EveryGatheredBufferIsReleasedAndEveryWholeGradientZeroedOnce) {
  for (const RankRecord& r : run()) {
    const int64_t shard = shard_elements(r.rank);
    const std::string whole_bytes = std::to_string(shard * job().parallel.dp * 4);
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    const size_t end = marker(r.calls, "teardown");
    int64_t releases = 0, zeroings = 0;
    for (size_t i = begin; i < end; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kKernel && call.label.starts_with("fsdp_fill")) {
        EXPECT_EQ(call.label.substr(call.label.rfind(' ') + 1), whole_bytes) << call.label;
        releases += call.label.starts_with("fsdp_fill release") ? 1 : 0;
        zeroings += call.label.starts_with("fsdp_fill zero") ? 1 : 0;
      }
      // The reduce-scatter's whole gradient is released right after it, on its stream.
      if (call.kind != Kind::kCollective || !is_fsdp_comm(labels.at(call.comm)) ||
          call.value != static_cast<int64_t>(CollectiveOp::kReduceScatterSum)) {
        continue;
      }
      size_t next = i + 1;
      while (next < end && r.calls[next].stream != call.stream) ++next;
      ASSERT_LT(next, end);
      EXPECT_EQ(r.calls[next].label, "fsdp_fill release bytes " + whole_bytes)
          << "rank " << r.rank << ": after the reduce-scatter at call " << i;
    }
    // Per (layer, micro-batch): the forward's and the backward's weights and the gradient
    // released, the gradient zeroed once; two iterations.
    const int64_t layer_micro_batches = job().model.num_layers * micro_batches();
    EXPECT_EQ(releases, 2 * 3 * layer_micro_batches) << "rank " << r.rank;
    EXPECT_EQ(zeroings, 2 * layer_micro_batches) << "rank " << r.rank;
  }
}

TEST_P(SimulatedFsdpRun, TheReducedShardsAreSummedOnTheComputeStreamAfterEachIteration) {
  for (const RankRecord& r : run()) {
    const std::string sum = "fsdp_accumulate " + std::to_string(shard_elements(r.rank));
    for (int64_t k = 1; k <= 2; ++k) {
      const size_t begin = marker(r.calls, "iteration " + std::to_string(k));
      ASSERT_LT(begin, r.calls.size());
      size_t end = begin + 1;
      while (end < r.calls.size() && r.calls[end].kind != Kind::kMark) ++end;
      std::vector<size_t> sums;
      size_t last_collective = begin;
      int64_t compute = -1;
      for (size_t i = begin; i < end; ++i) {
        if (r.calls[i].kind == Kind::kCollective) last_collective = i;
        if (r.calls[i].kind == Kind::kKernel && r.calls[i].label == sum) {
          sums.push_back(i);
          EXPECT_TRUE(compute == -1 || compute == r.calls[i].stream);
          compute = r.calls[i].stream;
        }
      }
      EXPECT_EQ(static_cast<int64_t>(sums.size()), job().model.num_layers * micro_batches())
          << "rank " << r.rank << ", iteration " << k;
      // After the iteration's last collective (its last reduce-scatter).
      ASSERT_FALSE(sums.empty());
      EXPECT_GT(sums.front(), last_collective);
    }
  }
}

TEST_P(SimulatedFsdpRun, NoHostWaitInsideAnIterationAndDpCommunicatorsWarmedToTheShard) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
    const std::string shard = std::to_string(shard_elements(r.rank));
    const size_t iteration = marker(r.calls, "iteration 1");
    int64_t warmed = 0;
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_fsdp_comm(label)) continue;
      bool gather = false, scatter = false;
      for (size_t i = 0; i < iteration; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.comm != comm || call.kind != Kind::kCollective || call.label != shard) continue;
        gather = gather || call.value == static_cast<int64_t>(CollectiveOp::kAllGather);
        scatter = scatter || call.value == static_cast<int64_t>(CollectiveOp::kReduceScatterSum);
      }
      EXPECT_TRUE(gather && scatter)
          << "rank " << r.rank << ": " << label << " not warmed at " << shard << " elements";
      ++warmed;
    }
    EXPECT_EQ(warmed, 3) << "rank " << r.rank;
  }
}

TEST_P(SimulatedFsdpRun, TheOtherGradientsAreSummedOverTheGradientGroupApart) {
  const std::vector<RankRecord> records =
      simulate_run(plan(), job(), GetParam(), 2, "32", SimulatedReduction{.overlap = true});
  for (const RankRecord& r : records) {
    // The buckets hold the parameters outside the layers, whole, and no shard.
    rt::StageModel model(job(), r.rank, {{0, job().model.num_layers}}, true, true, 7, {},
                         {.enabled = true});
    int64_t others = 0;
    for (const rt::ParameterView& p : model.parameters()) others += p.fsdp_shard ? 0 : p.count;
    int64_t bucketed = 0;
    for (const rt::ReductionBucket& bucket : r.buckets) bucketed += bucket.elements;
    ASSERT_FALSE(r.buckets.empty());
    EXPECT_EQ(bucketed, others) << "rank " << r.rank;
    EXPECT_EQ(r.parameter_elements, others) << "rank " << r.rank;
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    int64_t gradient_sums = 0;
    for (size_t i = begin; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != Kind::kCollective) continue;
      const std::string& label = labels.at(call.comm);
      if (is_fsdp_comm(label)) {
        EXPECT_NE(call.value, static_cast<int64_t>(CollectiveOp::kAllReduceSum))
            << "rank " << r.rank << ": a gradient bucket on FSDP's " << label;
      } else if (label.starts_with("dp x cp")) {
        ++gradient_sums;
      }
    }
    EXPECT_EQ(gradient_sums, 2 * static_cast<int64_t>(r.buckets.size())) << "rank " << r.rank;
  }
}

// DP 2 x TP 2 with sequence parallelism: each TP rank's layers sharded over its DP group;
// every DP communicator's members enqueue the same FSDP collectives, each of the rank's
// shard, beside the TP group's.
TEST_P(SimulatedFsdpRun, WithSequenceParallelismEachTpRanksShardsGoOverItsDpGroup) {
  JobSpec sp_job = job();
  sp_job.parallel.dp = 2;
  sp_job.parallel.tp = 2;
  sp_job.parallel.sp = true;
  const Plan sp_plan = plan_in_process(sp_job, "tiny-fsdp-sp.json");
  const JobSpec planned = job_from_plan(sp_plan, "tiny-fsdp-sp.json");
  const std::vector<RankRecord> records = simulate_run(sp_plan, planned, GetParam(), 1);
  std::map<std::string, std::vector<std::vector<std::pair<int64_t, std::string>>>> by_label;
  for (const RankRecord& r : records) {
    rt::StageModel model(planned, r.rank, {{0, planned.model.num_layers}}, true, true, 7, {},
                         {.enabled = true});
    const std::string shard = std::to_string(model.fsdp_layout("layers.0.fsdp_shard")->shard());
    const size_t begin = marker(r.calls, "iteration 1");
    for (const auto& [comm, label] : comm_labels(r)) {
      if (!is_fsdp_comm(label)) continue;
      std::vector<std::pair<int64_t, std::string>>& calls = by_label[label].emplace_back();
      for (size_t i = begin; i < r.calls.size(); ++i) {
        if (r.calls[i].kind != Kind::kCollective || r.calls[i].comm != comm) continue;
        EXPECT_EQ(r.calls[i].label, shard) << "rank " << r.rank << ": " << label;
        calls.emplace_back(r.calls[i].value, r.calls[i].label);
      }
    }
    EXPECT_EQ(calls_outside(r, 1, enqueueing_calls()), std::vector<std::string>{});
  }
  EXPECT_EQ(by_label.size(), 2u * 3);  // 2 DP groups (one per TP rank), 3 streams each
  int64_t collectives = 0;
  for (const auto& [label, members] : by_label) {
    ASSERT_EQ(members.size(), 2u) << label;
    EXPECT_EQ(members[0], members[1]) << label;
    collectives += static_cast<int64_t>(members[0].size());
  }
  // Per DP group, per (layer, micro-batch): two gathers and a reduce-scatter.
  const ParallelSpec& p = planned.parallel;
  const int64_t micro_batches = p.global_batch_size / (p.micro_batch_size * p.dp);
  EXPECT_EQ(collectives, 2 * 3 * planned.model.num_layers * micro_batches);
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedFsdpRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
