// The V and the interleaved shapes (planner/dhelix_shapes.h) on the CUDA path, on the
// recording fake device: every rank of examples/plans/tiny-tp2-pp2-v.json and
// tiny-tp2-pp2-interleaved.json set up as dhelix-run's CUDA engine sets up, two iterations
// of the real executor over the real model wiring, both modes. The lowering reads only
// layer ranges, so the engine runs these shapes' task lists as it runs the W's; what a GPU
// run needs of them so that it neither hangs nor mixes up data:
//   1. on every pipeline channel, member a's sends to member b and b's receives from a
//      agree call for call in count and type (NCCL matches them in enqueue order), and
//      every send or receive of the rank program is one such call;
//   2. nothing but enqueueing calls inside an iteration (no host wait).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/plan/rank_program.h"
#include "tests/device/example_runs.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Shape = std::tuple<std::string, ExecutionMode>;

class SimulatedPipelineShapeRun : public ::testing::TestWithParam<Shape> {
 protected:
  static ExampleRuns& runs(const std::string& name) {
    static std::map<std::string, std::unique_ptr<ExampleRuns>> examples;
    auto& slot = examples[name];
    if (!slot) slot = std::make_unique<ExampleRuns>(name);
    return *slot;
  }
  ExampleRuns& example() { return runs(std::get<0>(GetParam())); }
  ExecutionMode mode() const { return std::get<1>(GetParam()); }
};

bool is_pipeline(const std::string& label) { return label.starts_with("pp "); }

// A pipeline channel ("pp 0->2") has one sender and one receiver: its sends and receives,
// in enqueue order, by channel.
using ChannelLog = std::map<std::string, std::vector<std::pair<int64_t, int>>>;
ChannelLog by_channel(const PointToPointLog& log) {
  ChannelLog out;
  for (const auto& [key, list] : log) {
    auto& channel = out[std::get<0>(key)];
    channel.insert(channel.end(), list.begin(), list.end());
  }
  return out;
}

TEST_P(SimulatedPipelineShapeRun, SendsAndReceivesPairUpOnEveryChannel) {
  const std::vector<RankRecord>& records = example().run(mode());
  const PointToPointCalls calls = point_to_point_calls(records, is_pipeline, "iteration 1");
  const ChannelLog sent = by_channel(calls.sent);
  ASSERT_FALSE(sent.empty()) << "no pipeline transfer was enqueued";
  EXPECT_EQ(sent, by_channel(calls.received));
  // Every transfer of the programs is one call, in each of the two iterations.
  int64_t program_transfers = 0;
  for (const RankRecord& r : records) {
    const RankProgram program =
        lower_rank_program(example().plan(), example().job(), r.rank, mode());
    program_transfers += std::count_if(
        program.instructions.begin(), program.instructions.end(), [](const Instruction& i) {
          return i.kind == InstructionKind::kSend || i.kind == InstructionKind::kRecv;
        });
  }
  int64_t recorded = 0;
  for (const auto& [channel, list] : sent) recorded += 2 * static_cast<int64_t>(list.size());
  EXPECT_EQ(recorded, 2 * program_transfers);
}

TEST_P(SimulatedPipelineShapeRun, AnIterationOnlyEnqueues) {
  for (const RankRecord& r : example().run(mode())) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Shape>& param) {
  std::string name =
      std::get<0>(param.param) +
      (std::get<1>(param.param) == ExecutionMode::kCoExecuted ? "_coexecuted" : "_sequential");
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    ExamplePlans, SimulatedPipelineShapeRun,
    ::testing::Combine(::testing::Values("tiny-tp2-pp2-v", "tiny-tp2-pp2-interleaved"),
                       ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential)),
    case_name);

}  // namespace
}  // namespace dhelix::cuda::testing
