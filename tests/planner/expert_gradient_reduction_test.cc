// The gradient reduction after an iteration of a mixture of experts (planner/scheme_runs.cc,
// dp_times): the dense parameters reduce over dp·cp ranks, the experts over Megatron-Core's
// expert-data-parallel group, dp·cp·tp / (ep·etp) ranks. With etp = 1 beside tp = 2 every TP
// rank holds whole experts, so the experts' group spans the TP ranks: 4·1·2 / (2·1) = 4
// ranks here, where dp·cp/ep would be 2 (and, with dp = ep, 1: no reduction at all).
#include <gtest/gtest.h>

#include "lib/cluster_presets.h"
#include "lib/fsdp_sizes.h"
#include "planner/memory_model.h"
#include "profiler/collective_cost.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/planner/model_plan.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

// Phi-3.5-MoE with 2 layers on one H100 node: tp 2 (SP), dp 4, ep 2, experts whole on every
// TP rank (etp 1), the distributed optimizer (the planner's default).
JobSpec moe_job(int64_t dp, int64_t ep, int64_t expert_tp) {
  ModelSpec model = testing::phi35_moe();
  model.num_layers = 2;
  JobSpec job = testing::make_job(model, testing::Shape{.tp = 2, .dp = dp, .ep = ep, .sp = true});
  job.cluster = find_cluster_preset("h100").value();
  job.parallel.expert_tp = expert_tp;
  return job;
}

// Reduce-scatter of fp32 gradients and all-gather of bf16 weights of `parameters` over
// `ranks` GPUs of one node, as Megatron's distributed optimizer runs them after the backward.
double reduce_and_gather_us(const ClusterSpec& cluster, int64_t parameters, int64_t ranks) {
  if (ranks <= 1) return 0;
  const auto collective = [&](OpKind kind, int64_t bytes) {
    Op op = test::comm_op("dp", kind, bytes, ranks, GroupScope::kLocal, 1);
    op.group = ParallelDim::kDp;
    return collective_time_us(cluster, op);
  };
  return collective(OpKind::kReduceScatter, 4 * parameters) +
         collective(OpKind::kAllGather, 2 * parameters);
}

// Hidden plus exposed DP time of megatron-1f1b's plan: the reduction's solo time, however
// much of it the backward covers.
double megatron_dp_us(const JobSpec& job) {
  const Plan plan = test_jobs::model_plan(job);
  const PlanScheme* scheme = plan.find_scheme(PipelineScheme::kMegatron1F1B);
  if (scheme == nullptr) {
    ADD_FAILURE() << "no megatron-1f1b scheme";
    return 0;
  }
  for (const PlanCommTime& comm : scheme->comm) {
    if (comm.type == ParallelDim::kDp) return comm.hidden_us + comm.exposed_us;
  }
  ADD_FAILURE() << "no dp row";
  return 0;
}

TEST(ExpertGradientReduction, ExpertsReduceOverTheExpertDataParallelGroup) {
  const JobSpec job = moe_job(/*dp=*/4, /*ep=*/2, /*expert_tp=*/1);
  ASSERT_EQ(fsdp_expert_data_parallel_size(job.parallel), 4);  // 4·1·2 / (2·1)
  const StageParameters params =
      stage_parameters(job.model, job.parallel, PipelineShape::kOneFOneB, 0);
  // 8 of 16 experts of 78,643,200 parameters, whole, in each of 2 layers.
  ASSERT_EQ(params.expert, 2 * 8 * 78'643'200);
  const double dense = reduce_and_gather_us(job.cluster, params.dense, 4);
  const double experts = reduce_and_gather_us(job.cluster, params.expert, 4);
  EXPECT_NEAR(megatron_dp_us(job), dense + experts, 1e-6 * (dense + experts));
  // Over dp·cp/ep = 2 ranks the experts' part would be 1/2 of the bytes on the ring instead
  // of 3/4: a third shorter.
  EXPECT_GT(experts, 1.4 * reduce_and_gather_us(job.cluster, params.expert, 2));
}

TEST(ExpertGradientReduction, WholeExpertsOnEveryTpRankStillReduceWhenDpEqualsEp) {
  // dp = ep = 2: every DP rank holds other experts, but the two TP ranks hold the same whole
  // experts (etp 1), so they reduce over 2·1·2 / (2·1) = 2 ranks.
  const JobSpec job = moe_job(/*dp=*/2, /*ep=*/2, /*expert_tp=*/1);
  const StageParameters params =
      stage_parameters(job.model, job.parallel, PipelineShape::kOneFOneB, 0);
  const double dense = reduce_and_gather_us(job.cluster, params.dense, 2);
  const double experts = reduce_and_gather_us(job.cluster, params.expert, 2);
  ASSERT_GT(experts, 0);
  EXPECT_NEAR(megatron_dp_us(job), dense + experts, 1e-6 * (dense + experts));
}

TEST(ExpertGradientReduction, ExpertsSplitOverTpReduceOverDpTimesCpOverEp) {
  // etp = tp = 2 (Megatron-Core's default): 4·1·2 / (2·2) = 2 ranks, dp·cp/ep.
  const JobSpec job = moe_job(/*dp=*/4, /*ep=*/2, /*expert_tp=*/2);
  const StageParameters params =
      stage_parameters(job.model, job.parallel, PipelineShape::kOneFOneB, 0);
  ASSERT_EQ(params.expert, 2 * 8 * 78'643'200 / 2);
  const double dense = reduce_and_gather_us(job.cluster, params.dense, 4);
  const double experts = reduce_and_gather_us(job.cluster, params.expert, 2);
  EXPECT_NEAR(megatron_dp_us(job), dense + experts, 1e-6 * (dense + experts));
}

}  // namespace
}  // namespace dhelix
