// A MoE layer with a shared expert (Qwen2-MoE; runtime/model/moe_shared_expert_padded.h) on
// the CUDA path, on the recording fake device. No shipped example has one, so the plan is
// made here as dhelix-plan makes it: examples/jobs/tiny-moe-ep2.json's job (dp 2 = ep 2,
// 4 experts, top-2) with moe.shared_expert_ffn_hidden_size 64, planned in-process with the
// analytic model profile, written to text and read back as dhelix-run reads a plan file;
// then both ranks' set-up and two iterations of each mode (simulated_run.h). Checked:
//   1. the plan holds the shared expert's ops (tp = 1: fc1, SwiGLU, fc2 and their backward,
//      no TP exchange), and each rank's device runs its kernels: the gate forward and add,
//      the gate backward and the tp = 1 wgrad's scaling, once per (micro-batch, layer) and
//      iteration;
//   2. every GEMM shape an iteration runs was warmed at set-up, the shared expert's fc1,
//      fc2 and the h -> 1 gate among them (runtime/cuda/device_setup.cc's job_gemm_shapes),
//      and all nine of the shared expert's shapes run.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"
#include "runtime/cuda/device_setup.h"
#include "tests/device/example_runs.h"
#include "tests/device/plan_in_process.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

constexpr int64_t kSharedWidth = 64;

// tiny-moe-ep2's job with a shared expert of kSharedWidth, planned and read back.
struct SharedExpertPlan {
  Plan plan;
  JobSpec job;
};

SharedExpertPlan plan_shared_expert_job() {
  JobSpec job = read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-moe-ep2.json");
  job.model.moe->shared_expert_ffn_hidden_size = kSharedWidth;
  validate_job(job).throw_if_any();
  SharedExpertPlan out;
  out.plan = plan_in_process(job, "shared-expert.json");
  out.job = job_from_plan(out.plan, "shared-expert.json");
  return out;
}

class SimulatedSharedExpertRun : public ::testing::TestWithParam<ExecutionMode> {
 protected:
  static void SetUpTestSuite() {
    shared_ = new SharedExpertPlan(plan_shared_expert_job());
    records_ = new std::map<ExecutionMode, std::vector<RankRecord>>();
  }
  static void TearDownTestSuite() {
    delete shared_;
    delete records_;
    shared_ = nullptr;
    records_ = nullptr;
  }
  const std::vector<RankRecord>& run() {
    auto it = records_->find(GetParam());
    if (it == records_->end()) {
      it = records_->emplace(GetParam(), simulate_run(shared_->plan, shared_->job, GetParam(), 2))
               .first;
    }
    return it->second;
  }
  static SharedExpertPlan* shared_;
  static std::map<ExecutionMode, std::vector<RankRecord>>* records_;
};
SharedExpertPlan* SimulatedSharedExpertRun::shared_ = nullptr;
std::map<ExecutionMode, std::vector<RankRecord>>* SimulatedSharedExpertRun::records_ = nullptr;

// Kernel launches per label from the first iteration on.
std::map<std::string, int64_t> iteration_kernels(const RankRecord& r) {
  std::map<std::string, int64_t> counts;
  for (size_t i = marker(r.calls, "iteration 1"); i < r.calls.size(); ++i) {
    if (r.calls[i].kind == Kind::kKernel) ++counts[r.calls[i].label];
  }
  return counts;
}

TEST_P(SimulatedSharedExpertRun, ThePlanHoldsTheSharedExpertAndItsKernelsRun) {
  const JobSpec& job = shared_->job;
  ASSERT_TRUE(job.model.is_moe());
  EXPECT_EQ(job.model.moe->shared_expert_ffn_hidden_size, kSharedWidth);
  ASSERT_EQ(job.parallel.tp, 1);
  const int64_t layers = job.model.num_layers;  // pp 1: every layer on every rank
  const int64_t micro_batches =
      job.parallel.global_batch_size / (job.parallel.dp * job.parallel.micro_batch_size);
  for (const RankRecord& r : run()) {
    SCOPED_TRACE(::testing::Message() << "rank " << r.rank);
    const RankProgram program = lower_rank_program(shared_->plan, job, r.rank, GetParam());
    std::set<std::string> ops;
    for (const Instruction& i : program.instructions) {
      if (i.op.find("shared") != std::string_view::npos) ops.insert(std::string(i.op));
    }
    EXPECT_FALSE(ops.empty()) << "no shared-expert op in the program";
    const std::map<std::string, int64_t> kernels = iteration_kernels(r);
    // Per iteration and (micro-batch, layer): the gate and its add in fwd.shared_fc2, the
    // backward in bwd.shared_fc2_dgrad, the scaling in bwd.shared_fc2_wgrad.
    const int64_t expected = 2 * micro_batches * layers;
    for (const char* kernel : {"moe_shared_gate", "moe_shared_gate_add", "moe_shared_gate_backward",
                               "moe_shared_gate_scale"}) {
      const auto it = kernels.find(kernel);
      EXPECT_EQ(it == kernels.end() ? 0 : it->second, expected) << kernel;
    }
  }
}

TEST_P(SimulatedSharedExpertRun, EveryGemmShapeIsWarmedTheSharedExpertsIncluded) {
  const JobSpec& job = shared_->job;
  const RankShape d = rank_shape(job, 0);
  const std::vector<GemmShape> shared_shapes = {
      linear_forward_shape(d.rows, d.hidden, 2 * kSharedWidth),
      linear_dgrad_shape(d.rows, d.hidden, 2 * kSharedWidth),
      linear_wgrad_shape(d.rows, d.hidden, 2 * kSharedWidth),
      linear_forward_shape(d.rows, kSharedWidth, d.hidden),
      linear_dgrad_shape(d.rows, kSharedWidth, d.hidden),
      linear_wgrad_shape(d.rows, kSharedWidth, d.hidden),
      linear_forward_shape(d.rows, d.hidden, 1),
      linear_dgrad_shape(d.rows, d.hidden, 1),
      linear_wgrad_shape(d.rows, d.hidden, 1)};
  for (const RankRecord& r : run()) {
    SCOPED_TRACE(::testing::Message() << "rank " << r.rank);
    const size_t iteration = marker(r.calls, "iteration 1");
    ASSERT_LT(iteration, r.calls.size());
    std::set<GemmShape> warmed, ran;
    for (size_t i = 0; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (i < iteration && call.kind == Kind::kWarmGemm) warmed.insert(call.gemm);
      if (i > iteration && call.kind == Kind::kGemm) ran.insert(call.gemm);
    }
    for (const GemmShape& shape : ran) {
      EXPECT_TRUE(warmed.contains(shape))
          << "GEMM m " << shape.m << " n " << shape.n << " k " << shape.k << " not run at set-up";
    }
    for (const GemmShape& shape : shared_shapes) {
      EXPECT_TRUE(ran.contains(shape)) << "shared-expert GEMM m " << shape.m << " n " << shape.n
                                       << " k " << shape.k << " did not run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimulatedSharedExpertRun,
                         ::testing::Values(ExecutionMode::kCoExecuted, ExecutionMode::kSequential),
                         [](const auto& param_info) {
                           return param_info.param == ExecutionMode::kCoExecuted
                                      ? std::string("CoExecuted")
                                      : std::string("Sequential");
                         });

}  // namespace
}  // namespace dhelix::cuda::testing
