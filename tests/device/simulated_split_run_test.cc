// The CUDA path on a plan with split backward tasks (docs/runtime.md, "Split backward"), on
// the recording fake device: tiny-dp2-tp2 (DP 2 x TP 2) with its lone backwards split into
// an input part I and a weight part W two tasks later (tests/plan/split_backward.h), run
// with the overlapped reduction in buckets of 4096 elements. The executor, the arena and
// the reducer read the same programs as for any plan; what a split must not break:
//   1. every rank runs both modes' programs, the W's GEMMs included;
//   2. each bucket's reduction waits for an event recorded right after its last writer,
//      which for the weights of a split layer is an op of its W, not of its I;
//   3. nothing is allocated once the activations are laid out (the W's inputs have their
//      place in the arena until the W).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tests/device/example_runs.h"
#include "tests/plan/split_backward.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

struct SplitExample {
  Plan plan;
  JobSpec job;
};

const SplitExample& split_example() {
  static const SplitExample example = [] {
    ExampleRuns whole("tiny-dp2-tp2");
    SplitExample e{whole.plan(), whole.job()};
    dhelix::testing::split_lone_backwards(e.plan, 2);
    return e;
  }();
  return example;
}

int64_t gemms_of_iteration_1(const RankRecord& r) {
  const size_t begin = marker(r.calls, "iteration 1");
  int64_t gemms = 0;
  for (size_t i = begin + 1; i < r.calls.size() && r.calls[i].kind != Kind::kMark; ++i) {
    gemms += r.calls[i].kind == Kind::kGemm;
  }
  return gemms;
}

// 1 and 3: as many GEMMs as the unsplit plan's (the W's are enqueued), and no allocation
// after the layout.
TEST(SimulatedSplitRun, EveryRankRunsTheWeightPartsInBothModesWithoutAllocating) {
  const SplitExample& e = split_example();
  ExampleRuns whole("tiny-dp2-tp2");
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const std::vector<RankRecord> records = simulate_run(e.plan, e.job, mode, 2);
    const std::vector<RankRecord>& unsplit = whole.run(mode);
    ASSERT_EQ(records.size(), 4u);
    for (size_t k = 0; k < records.size(); ++k) {
      const RankRecord& r = records[k];
      EXPECT_GT(gemms_of_iteration_1(r), 0);
      EXPECT_EQ(gemms_of_iteration_1(r), gemms_of_iteration_1(unsplit[k])) << "rank " << r.rank;
      const size_t laid_out = marker(r.calls, "activations laid out");
      ASSERT_LT(laid_out, r.calls.size());
      for (size_t i = laid_out; i < r.calls.size(); ++i) {
        EXPECT_NE(r.calls[i].kind, Kind::kAllocate) << "rank " << r.rank << " call " << i;
      }
    }
  }
}

TEST(SimulatedSplitRun, EachBucketWaitsForItsLastWeightPart) {
  const SplitExample& e = split_example();
  const std::vector<RankRecord> records = simulate_run(
      e.plan, e.job, ExecutionMode::kCoExecuted, 1, "32",
      SimulatedReduction{.bucket_elements = 4096, .overlap = true, .mark_instructions = true});
  for (const RankRecord& r : records) {
    const RankProgram program =
        lower_rank_program(e.plan, e.job, r.rank, ExecutionMode::kCoExecuted);
    const size_t begin = marker(r.calls, "iteration 1"), update = marker(r.calls, "update 1");
    const std::map<int64_t, std::string> labels = comm_labels(r);
    std::vector<size_t> reductions;
    for (size_t i = begin; i < update; ++i) {
      if (r.calls[i].kind == Kind::kCollective && labels.at(r.calls[i].comm).starts_with("dp ")) {
        reductions.push_back(i);
      }
    }
    ASSERT_EQ(reductions.size(), r.buckets.size()) << "rank " << r.rank;
    int64_t weight_writers = 0;
    int64_t ready_after = 0;  // buckets go in order: one waits for those before it
    for (size_t k = 0; k < reductions.size(); ++k) {
      const int64_t writer = r.last_writers[k];
      ASSERT_GE(writer, 0);
      const Instruction& in = program.instructions[static_cast<size_t>(writer)];
      const PlanTask& task = e.plan.stages[0].tasks[static_cast<size_t>(in.task)];
      if (task.backward && task.backward->work == BackwardShare::kWeight) ++weight_writers;
      EXPECT_FALSE(task.backward && task.backward->work == BackwardShare::kInput &&
                   in.op.ends_with("_wgrad"))
          << "a weight gradient written in an I";
      ready_after = std::max(ready_after, writer);
      const size_t done = marker(r.calls, "done " + std::to_string(ready_after));
      EXPECT_LT(done, reductions[k]) << "rank " << r.rank << ", bucket " << k
                                     << ": reduced before its last writer was enqueued";
      // The reduction stream's last wait before the collective follows a record made after
      // that writer's mark.
      const int64_t stream = r.calls[reductions[k]].stream;
      size_t wait = reductions[k];
      while (wait > begin && !(r.calls[wait].kind == Kind::kWait && r.calls[wait].stream == stream))
        --wait;
      size_t record = wait;
      while (record > begin && !(r.calls[record].kind == Kind::kRecord &&
                                 r.calls[record].event == r.calls[wait].event))
        --record;
      EXPECT_LT(done, record) << "rank " << r.rank << ", bucket " << k;
    }
    EXPECT_GT(weight_writers, 0) << "rank " << r.rank << ": no bucket waits for a W";
  }
}

}  // namespace
}  // namespace dhelix::cuda::testing
