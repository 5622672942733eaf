// The NCCL warm-up (runtime/cuda/comm_warmup.h, device_comms.h step 4): on every
// communicator, every operation an iteration runs there was run before iteration 1 at the
// iteration's largest size, so that NCCL connects every algorithm it will pick at set-up
// (NCCL 2.22+ connects them lazily). Checked on the recording device over the example
// plans' simulated runs, both modes, with the DP reduction sharded (reduce-scatter and
// all-gather) and not (all-reduce).
#include "runtime/cuda/comm_warmup.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/cuda/device_comms.h"
#include "tests/device/example_runs.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

TEST(CommWarmup, SizeClassesAreOneTheLargestAndBetweenCapped) {
  EXPECT_EQ(warmup_size_classes(0, DeviceDtype::kFloat32), (std::vector<int64_t>{1}));
  EXPECT_EQ(warmup_size_classes(10, DeviceDtype::kFloat32), (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(warmup_size_classes(6400, DeviceDtype::kBFloat16),
            (std::vector<int64_t>{1, 100, 6400}));
  const int64_t most = kMaxWarmupBytes / 4;
  EXPECT_EQ(warmup_size_classes(int64_t{1} << 40, DeviceDtype::kFloat32),
            (std::vector<int64_t>{1, most / 64, most}));
}

TEST(CommWarmup, CollectiveGroupsRunAllThreeKindsAtEverySize) {
  const std::vector<WarmupOp> ops =
      comm_warmup_ops(CommRole::kCollectives, 6400, DeviceDtype::kBFloat16, 4);
  ASSERT_EQ(ops.size(), 9u);  // 3 sizes x 3 kinds
  std::map<CollectiveOp, int64_t> largest;
  for (const WarmupOp& op : ops) largest[op.op] = std::max(largest[op.op], op.count);
  EXPECT_EQ(largest[CollectiveOp::kAllGather], 1600);  // each member's share
  EXPECT_EQ(largest[CollectiveOp::kReduceScatterSum], 1600);
  EXPECT_EQ(largest[CollectiveOp::kAllReduceSum], 6400);
  // The gathered side: 4 members x 1600 bf16.
  EXPECT_EQ(warmup_buffer_bytes(ops, 4), 6400 * 2);
}

TEST(CommWarmup, ChannelsAreCappedAtTheRuntimesBlockLimitOthersAreNot) {
  // dhelix-profile makes its communicators with runtime_max_ctas too (profiler_host_test):
  // the runtime's must match it.
  ExampleRuns example("tiny-tp2-pp2");
  int64_t channels = 0;
  for (const RankRecord& r : example.run(ExecutionMode::kCoExecuted)) {
    for (const DeviceCall& call : r.calls) {
      if (call.kind != Kind::kCommInit) continue;
      const bool channel = call.label.starts_with("pp ");
      channels += channel ? 1 : 0;
      EXPECT_EQ(call.value, runtime_max_ctas(channel ? ParallelDim::kPp : ParallelDim::kTp))
          << call.label;
    }
  }
  EXPECT_GT(channels, 0);
  EXPECT_EQ(runtime_max_ctas(ParallelDim::kPp), DeviceCommSetup::kChannelMaxCtas);
}

// Per communicator and operation (a collective kind, or a send/receive to one peer): the
// largest count enqueued before iteration 1 and inside the iterations.
struct Seen {
  int64_t warmed = 0;
  int64_t used = 0;
};

std::map<std::pair<int64_t, std::pair<Kind, int64_t>>, Seen> operations(const RankRecord& r) {
  const size_t iteration = marker(r.calls, "iteration 1");
  std::map<std::pair<int64_t, std::pair<Kind, int64_t>>, Seen> seen;
  for (size_t i = 0; i < r.calls.size(); ++i) {
    const DeviceCall& call = r.calls[i];
    if (call.kind != Kind::kCollective && call.kind != Kind::kSend && call.kind != Kind::kRecv) {
      continue;
    }
    // A collective records its kind in value and its count in label; a transfer its peer
    // and its count.
    const int64_t count = call.kind == Kind::kCollective ? std::stoll(call.label) : call.count;
    Seen& s = seen[{call.comm, {call.kind, call.value}}];
    int64_t& slot = i < iteration ? s.warmed : s.used;
    slot = std::max(slot, count);
  }
  return seen;
}

class WarmupOfExample
    : public ::testing::TestWithParam<std::tuple<std::string, ExecutionMode, bool>> {};

TEST_P(WarmupOfExample, EveryOperationOfAnIterationIsWarmedAtItsSize) {
  const auto& [name, mode, sharded] = GetParam();
  ExampleRuns example(name);
  // The engine shards the optimizer over a DP x CP group of more than one only.
  const ParallelSpec& parallel = example.job().parallel;
  if (sharded && parallel.dp * parallel.cp == 1) GTEST_SKIP() << "nothing to shard";
  const std::vector<RankRecord> records =
      simulate_run(example.plan(), example.job(), mode, 2, "32",
                   SimulatedReduction{.bucket_elements = 5000, .sharded = sharded});
  int64_t checked = 0;
  for (const RankRecord& r : records) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    for (const auto& [key, seen] : operations(r)) {
      if (seen.used == 0) continue;  // the warm-up only
      ++checked;
      const std::string what =
          fmt::format("rank {}: {}, call kind {} value {}", r.rank, labels.at(key.first),
                      static_cast<int>(key.second.first), key.second.second);
      EXPECT_GT(seen.warmed, 0) << what << ": first run inside iteration 1";
      EXPECT_GE(seen.warmed, seen.used) << what << ": warmed up to " << seen.warmed
                                        << " elements, the iteration runs " << seen.used;
    }
  }
  EXPECT_GT(checked, 0);
}

std::string case_name(const ::testing::TestParamInfo<WarmupOfExample::ParamType>& param) {
  const auto& [plan, mode, sharded] = param.param;
  std::string name = plan + (mode == ExecutionMode::kCoExecuted ? "_coexecuted" : "_sequential") +
                     (sharded ? "_sharded" : "_allreduce");
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    ExamplePlans, WarmupOfExample,
    ::testing::Combine(::testing::Values("tiny-tp2-pp2", "tiny-dp2-tp2", "tiny-cp2-tp2",
                                         "tiny-moe-ep2-tp2", "tiny-moe-ep2-pp2"),
                       ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                       ::testing::Bool()),
    case_name);

}  // namespace
}  // namespace dhelix::cuda::testing
