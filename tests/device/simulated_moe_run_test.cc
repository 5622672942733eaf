// MoE on the CUDA path beyond EP alone, on the recording fake device: every rank of a plan
// set up as dhelix-run's CUDA engine sets up, two iterations of the real executor over the
// real model wiring (runtime/model/moe_layers_padded.h on RecordingBackend), both modes, for
//   tiny-moe-ep2-tp2        DP 2 x TP 2, EP 2, expert TP 2 (the etp exchanges over TP);
//   tiny-moe-ep2-recompute  EP 2 with full recompute (the MoE MLP repeated in backward);
//   tiny-moe-ep2-pp2        EP 2 with PP 2;
//   dropless                tiny-moe-ep2 with capacity factor 0 (blocks of T rows);
//   cp2                     tiny-moe-ep2's job with DP 1 x CP 2 (EP 2 over the CP ranks),
//                           planned here with the analytic profile;
//   shared-<example>        tiny-moe-ep2-tp2's and tiny-moe-ep2-recompute's jobs with a
//                           shared expert, planned here (its TP exchanges; its repeat).
// What a GPU run of each needs so that it neither hangs nor mixes up data
// (simulated_ep_run_test.cc checks the all-to-all's own shape on tiny-moe-ep2):
//   1. on every communicator, every member enqueues the same collectives in the same order
//      with the same counts and types, and member a's sends to b and b's receives from a
//      agree call for call (NCCL matches both in enqueue order);
//   2. nothing but enqueueing calls inside an iteration;
//   3. every GEMM shape an iteration runs was warmed at set-up (the experts' on etp ep C
//      padded rows, 1/etp of the FFN);
//   4. the MoE ops ran: the router once per micro-batch and layer (twice under full
//      recompute), and the arrivals of the dispatch and of the etp gather (with expert TP)
//      regrouped expert-major in forward, in a recompute's repeat and in backward;
//   5. nothing is allocated once the activations are laid out: the MoE layers' buffers
//      (dispatched and gathered rows, expert activations, the shared expert's) are in the
//      activation arena (runtime/model/moe_padded_buffers.h), so no iteration allocates.
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
#include "tests/device/example_runs.h"
#include "tests/device/plan_in_process.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

struct Variant {
  Plan plan;
  JobSpec job;
};

Variant variant(const std::string& name) {
  if (name == "dropless") {
    ExampleRuns base("tiny-moe-ep2");
    JobSpec job = base.job();
    job.model.moe->capacity_factor = 0.0;  // the plan's ops are the same; only T-row blocks
    return {base.plan(), job};
  }
  if (name.starts_with("shared-")) {  // shared-<example>: with a shared expert of width 64
    const std::string example = name.substr(7);
    JobSpec job = ExampleRuns(example).job();
    job.model.moe->shared_expert_ffn_hidden_size = 64;
    Plan plan = plan_in_process(job, name + ".json");
    return {plan, job_from_plan(plan, name + ".json")};
  }
  if (name == "cp2") {
    JobSpec job = ExampleRuns("tiny-moe-ep2").job();
    job.parallel.dp = 1;
    job.parallel.cp = 2;
    Plan plan = plan_in_process(job, "cp2.json");
    return {plan, job_from_plan(plan, "cp2.json")};
  }
  ExampleRuns example(name);
  return {example.plan(), example.job()};
}

class SimulatedMoeRun : public ::testing::TestWithParam<std::tuple<std::string, ExecutionMode>> {
 protected:
  static const Variant& plan_of(const std::string& name) {
    auto it = variants().find(name);
    if (it == variants().end()) it = variants().emplace(name, variant(name)).first;
    return it->second;
  }
  const Variant& current() { return plan_of(std::get<0>(GetParam())); }
  const std::vector<RankRecord>& run() {
    const auto key = GetParam();
    auto it = records().find(key);
    if (it == records().end()) {
      const Variant& v = current();
      it = records().emplace(key, simulate_run(v.plan, v.job, std::get<1>(key), 2)).first;
    }
    return it->second;
  }

 private:
  static std::map<std::string, Variant>& variants() {
    static auto* cache = new std::map<std::string, Variant>();
    return *cache;
  }
  static std::map<std::tuple<std::string, ExecutionMode>, std::vector<RankRecord>>& records() {
    static auto* cache =
        new std::map<std::tuple<std::string, ExecutionMode>, std::vector<RankRecord>>();
    return *cache;
  }
};

bool is_point_to_point(Kind kind) { return kind == Kind::kSend || kind == Kind::kRecv; }

// A communicator's members in rank order: "... ranks 0,2", or a pipeline channel "pp 0->2"
// (sender 0, receiver 1).
std::vector<int64_t> members(const std::string& label) {
  if (!label.starts_with("pp ")) return members_of(label);
  const size_t arrow = label.find("->");
  return {std::stoll(label.substr(3, arrow - 3)), std::stoll(label.substr(arrow + 2))};
}

TEST_P(SimulatedMoeRun, EveryCommunicatorsMembersAgreeCallForCall) {
  // label -> member -> its collectives (op, count, type), in enqueue order.
  std::map<std::string, std::map<int64_t, std::vector<std::tuple<int64_t, int64_t, int>>>>
      collectives;
  std::map<std::tuple<std::string, int64_t, int64_t>, std::vector<std::pair<int64_t, int>>> sent,
      received;
  for (const RankRecord& r : run()) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = marker(r.calls, "iteration 1");
    ASSERT_LT(begin, r.calls.size());
    for (size_t i = begin; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != Kind::kCollective && !is_point_to_point(call.kind)) continue;
      const std::string& label = labels.at(call.comm);
      const std::vector<int64_t> group = members(label);
      const auto me = std::find(group.begin(), group.end(), r.rank) - group.begin();
      ASSERT_LT(me, static_cast<int64_t>(group.size())) << label;
      if (call.kind == Kind::kCollective) {
        collectives[label][me].emplace_back(call.value, call.count, static_cast<int>(call.dtype));
        continue;
      }
      const std::pair<int64_t, int> transfer{call.count, static_cast<int>(call.dtype)};
      if (call.kind == Kind::kSend) sent[{label, me, call.value}].push_back(transfer);
      if (call.kind == Kind::kRecv) received[{label, call.value, me}].push_back(transfer);
    }
  }
  EXPECT_EQ(sent, received);
  for (const auto& [label, by_member] : collectives) {
    if (by_member.empty()) continue;
    for (const auto& [member, calls] : by_member) {
      EXPECT_EQ(calls, by_member.begin()->second) << label << ": member " << member;
    }
  }
  EXPECT_FALSE(sent.empty());
}

// A group of one needs no NCCL communicator: at tp = 1 no rank creates a TP one, and the
// expert-data-parallel group (dp x cp / ep: one member in every example) is local; the
// NCCL streams counted against the hardware queues are those of the communicators made
// (before, three TP communicators and the expert group were made and warmed regardless).
TEST_P(SimulatedMoeRun, NoCommunicatorForAGroupOfOne) {
  const ParallelSpec& parallel = current().job.parallel;
  ASSERT_EQ(parallel.dp * parallel.cp / parallel.ep, 1) << "every variant's expert group is 1";
  for (const RankRecord& r : run()) {
    int64_t inits = 0;
    for (const DeviceCall& call : r.calls) {
      if (call.kind != Kind::kCommInit) continue;
      ++inits;
      EXPECT_FALSE(call.label.starts_with("expert dp")) << "rank " << r.rank << ": " << call.label;
      if (parallel.tp == 1) {
        EXPECT_FALSE(call.label.starts_with("tp")) << "rank " << r.rank << ": " << call.label;
      }
    }
    EXPECT_EQ(r.library_streams, 2 * inits) << "rank " << r.rank;  // the fake's 2 per comm
  }
}

TEST_P(SimulatedMoeRun, NoHostSynchronisationInsideAnIteration) {
  for (const RankRecord& r : run()) {
    for (int64_t k = 1; k <= 2; ++k) {
      EXPECT_EQ(calls_outside(r, k, enqueueing_calls()), std::vector<std::string>{});
    }
  }
}

TEST_P(SimulatedMoeRun, EveryGemmShapeIsWarmedAndTheMoeOpsRun) {
  const JobSpec& job = current().job;
  const bool expert_tp = job.parallel.expert_tp_size() > 1;
  const bool full = job.parallel.recompute.granularity == RecomputeGranularity::kFull;
  for (const RankRecord& r : run()) {
    const size_t iteration = marker(r.calls, "iteration 1");
    const size_t second = marker(r.calls, "iteration 2");
    ASSERT_LT(iteration, second);
    std::set<GemmShape> warmed;
    for (size_t i = 0; i < iteration; ++i) {
      if (r.calls[i].kind == Kind::kWarmGemm) warmed.insert(r.calls[i].gemm);
    }
    std::map<std::string, int64_t> kernels;
    int64_t gemms = 0;
    for (size_t i = iteration; i < second; ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind == Kind::kKernel) ++kernels[call.label];
      if (call.kind != Kind::kGemm) continue;
      ++gemms;
      EXPECT_TRUE(warmed.contains(call.gemm))
          << "rank " << r.rank << ": GEMM m " << call.gemm.m << " n " << call.gemm.n << " k "
          << call.gemm.k << " not run at set-up";
    }
    EXPECT_GT(gemms, 0);
    if (kernels["moe_route"] == 0) continue;  // a pipeline stage without layers
    // Per (micro-batch, layer): one route, one more under full recompute (the repeat).
    ASSERT_EQ(kernels["moe_route"] % (full ? 2 : 1), 0);
    const int64_t pairs = kernels["moe_route"] / (full ? 2 : 1);
    // Arrivals regrouped expert-major: the dispatch's and the forward etp gather's, each
    // again in a full recompute's repeat, and the backward combine's and etp gather's.
    const int64_t exchanges = (job.parallel.ep > 1 ? 1 : 0) + (expert_tp ? 1 : 0);
    EXPECT_EQ(kernels["moe_regroup to expert"], pairs * (full ? 3 : 2) * exchanges)
        << "rank " << r.rank;
  }
}

TEST_P(SimulatedMoeRun, NoAllocationOnceTheActivationsAreLaidOut) {
  for (const RankRecord& r : run()) {
    const size_t laid_out = marker(r.calls, "activations laid out");
    ASSERT_LT(laid_out, r.calls.size());
    for (size_t i = laid_out; i < r.calls.size(); ++i) {
      EXPECT_NE(r.calls[i].kind, Kind::kAllocate)
          << "rank " << r.rank << ": an allocation of " << r.calls[i].value
          << " bytes after the activations were laid out, at call " << i;
    }
  }
}

std::string variant_name(const ::testing::TestParamInfo<SimulatedMoeRun::ParamType>& info) {
  std::string name = std::get<0>(info.param);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name +
         (std::get<1>(info.param) == ExecutionMode::kCoExecuted ? "_CoExecuted" : "_Sequential");
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SimulatedMoeRun,
    ::testing::Combine(::testing::Values("tiny-moe-ep2-tp2", "tiny-moe-ep2-recompute",
                                         "tiny-moe-ep2-pp2", "dropless", "cp2",
                                         "shared-tiny-moe-ep2-tp2",
                                         "shared-tiny-moe-ep2-recompute"),
                       ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential)),
    variant_name);

}  // namespace
}  // namespace dhelix::cuda::testing
