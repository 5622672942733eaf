#include "planner/scheme_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/cluster_presets.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "planner/chosen_split.h"
#include "planner/config_search.h"
#include "planner/config_space.h"
#include "planner/pipeline_schedule.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "profiler/model_search.h"
#include "tests/planner/model_plan.h"

namespace dhelix {
namespace {

// llama-8b's shapes with `layers` layers on H100s, global batch 16 x 4096.
JobSpec base_job(int64_t layers) {
  JobSpec job;
  job.model = read_model_file(std::string(DHELIX_SOURCE_DIR) + "/examples/models/llama-8b.json");
  job.model.num_layers = layers;
  job.cluster = find_cluster_preset("h100").value();
  job.parallel.global_batch_size = 16;
  job.parallel.seq_length = 4096;
  job.name = "scheme-memory-test";
  return job;
}

Plan plan_of(const JobSpec& job) { return test_jobs::model_plan(job); }

// Every stage of both schemes: the bytes recomputed without times equal the plan's, term by
// term: Megatron-1F1B's from scheme_memory, dhelix's from the plan's own task lists (the
// shape and split it chose), and scheme_memory's dhelix where the plan took the W whole.
void expect_plan_memory(const JobSpec& job) {
  const Plan plan = plan_of(job);
  for (PipelineScheme scheme : {PipelineScheme::kDHelix, PipelineScheme::kMegatron1F1B}) {
    const bool own_tasks = scheme == PipelineScheme::kDHelix;
    const std::vector<StageMemory> ahead =
        own_tasks ? schedule_memory(job, schedule_of_plan(plan), PlanRequest{}.memory)
                  : scheme_memory(job, scheme, PlanRequest{}.memory);
    const PlanScheme* planned = nullptr;
    for (const PlanScheme& s : plan.schemes) {
      if (s.scheme == scheme) planned = &s;
    }
    ASSERT_NE(planned, nullptr);
    ASSERT_EQ(ahead.size(), planned->memory.size());
    for (size_t s = 0; s < ahead.size(); ++s) {
      SCOPED_TRACE(job.name + " " + pipeline_scheme_name(scheme) + " stage " + std::to_string(s));
      EXPECT_EQ(ahead[s].weight_bytes, planned->memory[s].weight_bytes);
      EXPECT_EQ(ahead[s].optimizer_bytes, planned->memory[s].optimizer_bytes);
      EXPECT_EQ(ahead[s].activation_bytes, planned->memory[s].activation_bytes);
      EXPECT_EQ(ahead[s].total_bytes(), planned->memory[s].total_bytes);
    }
  }
}

// The configuration space of a 6-layer model on 8 GPUs (even and uneven stages, SP, CP,
// micro-batches 1-8, no/selective/full recompute): scheme_memory is the plan's memory.
TEST(SchemeMemory, EqualsThePlansMemoryAcrossASpace) {
  const JobSpec base = base_job(6);
  SearchConstraints constraints;  // CP layers plan slowly; the memory of CP is the same code
  constraints.allow_cp = false;
  constraints.max_micro_batch_size = 2;
  int64_t checked = 0;
  SearchRequest times;  // the solo times the search chooses uneven splits with
  use_model_profiles(times);
  for (const ParallelSpec& parallel : enumerate_configurations(base, 8, constraints)) {
    JobSpec job = configuration_job(base, parallel);
    if (!validate_job(job).empty()) continue;
    job =
        with_planned_split(job, [&](const Op& op) { return times.solo_time_us(job.cluster, op); });
    expect_plan_memory(job);
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

// Block recompute and uneven stages set the chunk byte fields apart from the layer's.
TEST(SchemeMemory, EqualsThePlansMemoryWithBlockRecomputeAndUnevenStages) {
  JobSpec job = base_job(14);
  job.parallel.tp = 2;
  job.parallel.sp = true;
  job.parallel.pp = 4;
  job.parallel.dp = 1;
  job.parallel.micro_batch_size = 1;
  job.parallel.recompute = {.granularity = RecomputeGranularity::kFull,
                            .method = RecomputeMethod::kBlock,
                            .num_layers = 2};
  job.parallel.first_stage_layers = 3;  // 3 + 4 + 4 + 3
  job.parallel.last_stage_layers = 3;
  const ProblemList problems = validate_job(job);
  ASSERT_TRUE(problems.empty()) << problems.problems().front().rule;
  expect_plan_memory(job);
}

// The file comment's worked case: what stage 0 holds at its peak, in chunks.
TEST(SchemeMemory, PeaksFollowTheScheduleOrder) {
  JobSpec job = base_job(8);
  job.parallel.pp = 4;
  job.parallel.dp = 2;
  job.parallel.micro_batch_size = 1;  // m = 16 / 2 = 8 micro-batches
  const MemoryOptions options;
  const std::vector<StageMemory> megatron =
      scheme_memory(job, PipelineScheme::kMegatron1F1B, options);
  const int64_t chunk = chunk_activation_bytes(job.model, job.parallel, 2, options);
  EXPECT_EQ(megatron[0].activation_bytes, 4 * chunk);  // pp forwards before the first backward
  EXPECT_EQ(megatron[3].activation_bytes,
            std::max(chunk, head_loss_transient_bytes(job.model, job.parallel) + chunk));
}

}  // namespace
}  // namespace dhelix
