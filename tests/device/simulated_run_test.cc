// The CUDA path of dhelix-run on the recording fake device: every rank of the tiny TP2 x PP2
// plan set up, two iterations of the co-executed program (and of the sequential one), and
// the teardown, asserting what a GPU run needs to neither hang nor race (docs/gpu.md):
//   1. every kernel is loaded, the stack limit set, every GEMM shape the iteration runs
//      warmed and the attention path decided (cuDNN's plans and self-check) before the
//      first receive is posted;
//   2. every communicator is warmed before the first iteration;
//   3. communicators are destroyed in the same order on every rank;
//   4. each wait on an event follows a record of that event in the same iteration;
//   5. no host synchronisation (nor creation, allocation or set-up call) inside an iteration;
//   6. the streams counted against CUDA_DEVICE_MAX_CONNECTIONS include NCCL's.
#include "tests/device/simulated_run.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/rank_shape.h"
#include "runtime/cuda/device_streams.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

class SimulatedRun : public ::testing::TestWithParam<ExecutionMode> {
 protected:
  static void SetUpTestSuite() {
    const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json";
    plan_ = new Plan(read_plan(path));
    job_ = new JobSpec(job_from_plan(*plan_, "tiny-tp2-pp2"));
  }
  static void TearDownTestSuite() {
    delete job_;
    delete plan_;
  }
  std::vector<RankRecord> run(int64_t iterations = 2) {
    return simulate_run(*plan_, *job_, GetParam(), iterations);
  }
  static Plan* plan_;
  static JobSpec* job_;
};
Plan* SimulatedRun::plan_ = nullptr;
JobSpec* SimulatedRun::job_ = nullptr;

size_t first_index(const std::vector<DeviceCall>& calls, Kind kind, const std::string& label = "") {
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].kind == kind && (label.empty() || calls[i].label == label)) return i;
  }
  return calls.size();
}

// [begin, end) of iteration `k`'s calls: from its marker to the next one.
std::pair<size_t, size_t> iteration_range(const std::vector<DeviceCall>& calls, int64_t k) {
  const size_t begin = first_index(calls, Kind::kMark, "iteration " + std::to_string(k));
  size_t end = begin + 1;
  while (end < calls.size() && calls[end].kind != Kind::kMark) ++end;
  return {begin, end};
}

TEST_P(SimulatedRun, EveryRankRunsTheWholeProgramOnTheFake) {
  const std::vector<RankRecord> records = run();
  ASSERT_EQ(records.size(), 4u);
  for (const RankRecord& r : records) {
    const auto [begin, end] = iteration_range(r.calls, 1);
    int64_t kernels = 0, gemms = 0, receives = 0, sends = 0;
    for (size_t i = begin; i < end; ++i) {
      kernels += r.calls[i].kind == Kind::kKernel;
      gemms += r.calls[i].kind == Kind::kGemm;
      receives += r.calls[i].kind == Kind::kRecv;
      sends += r.calls[i].kind == Kind::kSend;
    }
    EXPECT_GT(kernels, 0) << "rank " << r.rank;
    EXPECT_GT(gemms, 0) << "rank " << r.rank;
    EXPECT_GT(receives + sends, 0) << "rank " << r.rank;  // every rank of PP2 talks
  }
}

TEST_P(SimulatedRun, KernelsStackAndGemmShapesAreReadyBeforeTheFirstReceive) {
  for (const RankRecord& r : run()) {
    const std::vector<DeviceCall>& calls = r.calls;
    const size_t first_recv = first_index(calls, Kind::kRecv);
    ASSERT_LT(first_recv, calls.size()) << "rank " << r.rank;
    const size_t load = first_index(calls, Kind::kLoadKernels);
    const size_t stack = first_index(calls, Kind::kStackLimit);
    EXPECT_LT(load, first_recv) << "rank " << r.rank;
    ASSERT_LT(stack, first_recv) << "rank " << r.rank;
    EXPECT_GE(calls[stack].value, 4096);  // RecordingDevice's largest kernel stack
    std::set<GemmShape> warmed;
    for (size_t i = 0; i < first_recv; ++i) {
      if (calls[i].kind == Kind::kWarmGemm) warmed.insert(calls[i].gemm);
    }
    for (const DeviceCall& call : calls) {
      if (call.kind != Kind::kGemm) continue;
      EXPECT_TRUE(warmed.contains(call.gemm))
          << "rank " << r.rank << ": GEMM m " << call.gemm.m << " n " << call.gemm.n << " k "
          << call.gemm.k << " not run at set-up";
    }
    // Nothing after the first receive loads a kernel or warms a shape.
    for (size_t i = first_recv; i < calls.size(); ++i) {
      EXPECT_NE(calls[i].kind, Kind::kLoadKernels);
      EXPECT_NE(calls[i].kind, Kind::kWarmGemm);
      EXPECT_NE(calls[i].kind, Kind::kPrepareAttention);
    }
  }
}

TEST_P(SimulatedRun, AttentionIsPreparedOnceBesideTheGemmWarmUpBeforeTheFirstReceive) {
  for (const RankRecord& r : run()) {
    const std::vector<DeviceCall>& calls = r.calls;
    const size_t first_recv = first_index(calls, Kind::kRecv);
    const size_t prepared = first_index(calls, Kind::kPrepareAttention);
    ASSERT_LT(prepared, first_recv) << "rank " << r.rank;
    // After the kernels are loaded and the stack is set, on the stream the GEMMs warm on.
    EXPECT_GT(prepared, first_index(calls, Kind::kStackLimit)) << "rank " << r.rank;
    const size_t warm = first_index(calls, Kind::kWarmGemm);
    ASSERT_LT(warm, calls.size());
    EXPECT_EQ(calls[prepared].stream, calls[warm].stream) << "rank " << r.rank;
    EXPECT_EQ(std::count_if(calls.begin(), calls.end(),
                            [](const DeviceCall& c) { return c.kind == Kind::kPrepareAttention; }),
              1)
        << "rank " << r.rank;
    // The tiny job's attention on one rank: micro-batch 1 x 64 tokens, 4 heads / tp 2.
    const RankShape shape = rank_shape(*job_, r.rank);
    EXPECT_EQ(calls[prepared].label,
              fmt::format("batch {} seq {} heads {} kv_heads {} head_dim {}", shape.micro_batch,
                          shape.seq_shard, shape.heads, shape.kv_heads, shape.head_dim));
    // Every attention of the iterations runs the prepared shape (cuDNN has plans for it).
    int64_t attentions = 0;
    for (const DeviceCall& call : calls) {
      if (call.kind != Kind::kKernel || !call.label.starts_with("attention_")) continue;
      ++attentions;
      EXPECT_EQ(call.label.substr(call.label.find(' ') + 1), calls[prepared].label);
    }
    EXPECT_GT(attentions, 0) << "rank " << r.rank;
    // The fake has no cuDNN, so the set-up falls back to dhelix's kernel and says why.
    ASSERT_TRUE(r.attention.has_value()) << "rank " << r.rank;
    EXPECT_EQ(r.attention->path, AttentionPath::kDhelix);
    EXPECT_EQ(r.attention->reason, "dhelix's kernel (built without cuDNN)");
  }
}

TEST_P(SimulatedRun, EveryCommunicatorIsWarmedBeforeTheFirstIteration) {
  for (const RankRecord& r : run()) {
    const size_t first_iteration = first_index(r.calls, Kind::kMark, "iteration 1");
    std::set<int64_t> created, warmed;
    for (size_t i = 0; i < first_iteration; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kCommInit) created.insert(call.comm);
      if (call.kind == Kind::kCollective || call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        warmed.insert(call.comm);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(created.size()), r.communicators);
    EXPECT_EQ(warmed, created) << "rank " << r.rank;
    // No communicator is created once iterations run.
    for (size_t i = first_iteration; i < r.calls.size(); ++i) {
      EXPECT_NE(r.calls[i].kind, Kind::kCommInit);
    }
  }
}

TEST_P(SimulatedRun, CommunicatorsAreDestroyedInOneOrderOnEveryRank) {
  const std::vector<RankRecord> records = run(1);
  std::vector<std::vector<std::string>> orders;
  for (const RankRecord& r : records) {
    std::map<int64_t, std::string> label;
    std::vector<std::string> order;
    for (const DeviceCall& call : r.calls) {
      if (call.kind == Kind::kCommInit) {
        label[call.comm] = call.label.substr(0, call.label.find(" member"));
      }
      if (call.kind == Kind::kCommDestroy) order.push_back(label.at(call.comm));
    }
    EXPECT_EQ(order.size(), label.size()) << "rank " << r.rank << ": each destroyed once";
    orders.push_back(order);
  }
  // Any two ranks destroy the communicators they share in the same relative order.
  for (size_t a = 0; a < orders.size(); ++a) {
    for (size_t b = a + 1; b < orders.size(); ++b) {
      const std::set<std::string> in_b(orders[b].begin(), orders[b].end());
      const std::set<std::string> in_a(orders[a].begin(), orders[a].end());
      std::vector<std::string> shared_a, shared_b;
      for (const std::string& name : orders[a]) {
        if (in_b.contains(name)) shared_a.push_back(name);
      }
      for (const std::string& name : orders[b]) {
        if (in_a.contains(name)) shared_b.push_back(name);
      }
      EXPECT_EQ(shared_a, shared_b) << "ranks " << a << " and " << b;
    }
  }
  // Ranks 0 and 2 share a pipeline channel each way (0->2 and 2->0) and nothing else.
  EXPECT_NE(std::find(orders[0].begin(), orders[0].end(), "pp 0->2"), orders[0].end());
  EXPECT_NE(std::find(orders[0].begin(), orders[0].end(), "pp 2->0"), orders[0].end());
}

TEST_P(SimulatedRun, EveryWaitFollowsARecordOfItsEventInTheSameIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      const auto [begin, end] = iteration_range(r.calls, k);
      std::set<int64_t> recorded;
      int64_t waits = 0;
      for (size_t i = begin; i < end; ++i) {
        const DeviceCall& call = r.calls[i];
        if (call.kind == Kind::kRecord) recorded.insert(call.event);
        if (call.kind != Kind::kWait) continue;
        ++waits;
        EXPECT_TRUE(recorded.contains(call.event))
            << "rank " << r.rank << ", iteration " << k << ", call " << i << ": stream "
            << call.stream << " waits on event " << call.event << " before its record";
      }
      EXPECT_GT(waits, 0);
    }
  }
}

TEST_P(SimulatedRun, NoHostSynchronisationInsideAnIteration) {
  // From the iteration's first record (its start event) to its last (its end event) only
  // enqueueing calls and non-blocking queries.
  const std::set<Kind> allowed = {Kind::kRecord,     Kind::kWait, Kind::kKernel, Kind::kGemm,
                                  Kind::kCollective, Kind::kSend, Kind::kRecv,   Kind::kDelay};
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      const auto [begin, end] = iteration_range(r.calls, k);
      size_t first = end, last = begin;
      for (size_t i = begin; i < end; ++i) {
        if (r.calls[i].kind != Kind::kRecord) continue;
        first = std::min(first, i);
        last = i;
      }
      ASSERT_LT(first, last);
      for (size_t i = first; i <= last; ++i) {
        EXPECT_TRUE(allowed.contains(r.calls[i].kind))
            << "rank " << r.rank << ", iteration " << k << ": " << device_call_name(r.calls[i].kind)
            << " inside the iteration";
      }
    }
  }
}

TEST_P(SimulatedRun, NoAllocationOnceTheActivationsAreLaidOut) {
  // The arena (runtime/model/activation_arena.h) is allocated while the activations are
  // laid out, before the first iteration: no iteration allocates, not even the first one's
  // binding. Without the arena every (micro-batch, layer) buffer was allocated there.
  for (const RankRecord& r : run()) {
    const size_t laid_out = first_index(r.calls, Kind::kMark, "activations laid out");
    ASSERT_LT(laid_out, r.calls.size());
    int64_t arena = 0;
    for (size_t i = 0; i < laid_out; ++i) {
      if (r.calls[i].kind == Kind::kAllocate) arena = std::max(arena, r.calls[i].value);
    }
    EXPECT_GT(arena, 0) << "rank " << r.rank << ": no arena allocated";
    for (size_t i = laid_out; i < r.calls.size(); ++i) {
      EXPECT_NE(r.calls[i].kind, Kind::kAllocate)
          << "rank " << r.rank << ": an allocation of " << r.calls[i].value
          << " bytes after the activations were laid out, at call " << i;
    }
  }
}

TEST_P(SimulatedRun, StreamsCountedAgainstTheConnectionLimitIncludeNcclsOwn) {
  for (const RankRecord& r : run(1)) {
    // Streams alive when the iteration starts: created minus destroyed before it.
    const size_t first_iteration = first_index(r.calls, Kind::kMark, "iteration 1");
    int64_t alive = 0;
    for (size_t i = 0; i < first_iteration; ++i) {
      alive += r.calls[i].kind == Kind::kCreateStream;
      alive -= r.calls[i].kind == Kind::kDestroyStream;
    }
    EXPECT_EQ(r.own_streams, alive) << "rank " << r.rank;
    EXPECT_EQ(r.library_streams, 2 * r.communicators) << "rank " << r.rank;
    // tiny-tp2-pp2: 4 streams + 1 channel stream; 3 TP communicators + 2 channels.
    EXPECT_EQ(r.own_streams, 5);
    EXPECT_EQ(r.communicators, 5);
  }
  // CUDA's default 8 queues are too few for 5 + 10 streams: refused before any set-up.
  try {
    simulate_run(*plan_, *job_, GetParam(), 1, "8");
    FAIL() << "8 hardware queues accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(error.what())
                  .find("15 CUDA streams on this rank (5 of its own, 10 of "
                        "NCCL's)"),
              std::string::npos)
        << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
