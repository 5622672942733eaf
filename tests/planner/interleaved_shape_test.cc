// The dhelix plan on interleaved stages (planner/dhelix_shapes.h): Megatron's combined 1F1B
// order over its interleaved schedule runs every pass once, respects every dependency and
// never deadlocks; auto and --shape interleaved choose it; the plan's stages list their
// model chunks and each task part its chunk; a job without interleaved stages refuses it.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lib/cluster_presets.h"
#include "lib/error.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "planner/baseline_schedules.h"
#include "planner/combined_1f1b.h"
#include "planner/plan_builder.h"
#include "planner/search_bounds.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/planner/llama8b_h100_job.h"
#include "tests/planner/model_plan.h"

namespace dhelix {
namespace {

using Key = std::tuple<WorkPass, int64_t, int64_t, int64_t>;  // pass, micro-batch, stage, chunk

Key key_of(const WorkItem& w) { return {w.pass, w.micro_batch, w.stage, w.model_chunk}; }

// Runs the stages' task lists as the runtime does, one task at a time per stage, a task
// starting once every input of every work item it holds is done (an SI block waits for its
// forward's and its backward's). Returns false on a deadlock.
bool runs_to_the_end(const PipelineSchedule& s) {
  const size_t pp = s.stages.size();
  std::vector<size_t> next(pp, 0);
  std::set<Key> done;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t p = 0; p < pp; ++p) {
      if (next[p] == s.stages[p].size()) continue;
      const std::vector<WorkItem> work = task_work(s.stages[p][next[p]], static_cast<int64_t>(p));
      bool ready = true;
      for (const WorkItem& w : work) {
        for (const WorkItem& input : work_inputs(s, w)) ready = ready && done.count(key_of(input));
      }
      if (!ready) continue;
      for (const WorkItem& w : work) done.insert(key_of(w));
      ++next[p];
      progress = true;
    }
  }
  for (size_t p = 0; p < pp; ++p) {
    if (next[p] != s.stages[p].size()) return false;
  }
  return true;
}

TEST(InterleavedShape, EveryPassOnceDependenciesRespectedNoDeadlock) {
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t v = 2; v <= 3; ++v) {
      for (int64_t m = pp; m <= 8; m += pp) {
        SCOPED_TRACE(fmt::format("pp {} v {} m {}", pp, v, m));
        const PipelineSchedule s = make_combined_1f1b_schedule(make_interleaved_schedule(pp, m, v));
        std::map<Key, int> count;
        for (int64_t p = 0; p < pp; ++p) {
          for (const PipelineTask& task : s.stages[static_cast<size_t>(p)]) {
            for (const WorkItem& w : task_work(task, p)) count[key_of(w)] += 1;
          }
        }
        // A forward and a backward per micro-batch, stage and model chunk; a head-loss step
        // per micro-batch.
        EXPECT_EQ(static_cast<int64_t>(count.size()), 2 * m * pp * v + m);
        for (const auto& [key, c] : count) EXPECT_EQ(c, 1);
        EXPECT_TRUE(runs_to_the_end(s));
        // With m = pp stage 0's warm-up holds every forward: no pair there.
        EXPECT_EQ(s.si_block_count(0) > 0, m > pp);
      }
    }
  }
}

std::vector<std::string> labels(const std::vector<PipelineTask>& tasks) {
  std::vector<std::string> out;
  for (const PipelineTask& t : tasks) out.push_back(t.label());
  return out;
}

// docs/pipeline.md's worked table: pp 2, m 4, v 2.
TEST(InterleavedShape, WorkedOrderOnTwoStages) {
  const PipelineSchedule s = make_combined_1f1b_schedule(make_interleaved_schedule(2, 4, 2));
  EXPECT_EQ(
      labels(s.stages[0]),
      (std::vector<std::string>{"F0.0", "F1.0", "F0.1", "F1.1", "F2.0", "F3.0+B0.1", "F2.1+B1.1",
                                "F3.1+B0.0", "B1.0", "B2.1", "B3.1", "B2.0", "B3.0"}));
  EXPECT_EQ(labels(s.stages[1]),
            (std::vector<std::string>{"F0.0", "F1.0", "F0.1", "H0", "F1.1+B0.1", "H1", "F2.0+B1.1",
                                      "F3.0+B0.0", "F2.1+B1.0", "H2", "F3.1+B2.1", "H3", "B3.1",
                                      "B2.0", "B3.0"}));
}

// ----- the plan -----------------------------------------------------------------------------

// llama-8b's shapes with 16 layers on H100s, TP 2, PP 2, 16 micro-batches: v = 8 by default.
JobSpec job_of(int64_t gbs) {
  return test_jobs::llama8b_h100_job(2, gbs, "interleaved-shape-test");
}

Plan plan_of(const JobSpec& job, ShapeRequest shape, int64_t virtual_pipeline) {
  return test_jobs::model_plan(job, {.shape = shape, .virtual_pipeline_size = virtual_pipeline});
}

TEST(InterleavedShape, ShapeInterleavedWritesModelChunks) {
  const Plan plan = plan_of(job_of(16), ShapeRequest::kInterleaved, 2);
  ASSERT_TRUE(plan.shape_choice.has_value());
  EXPECT_EQ(plan.schema_version, kPlanSchemaVersionInterleaved);
  EXPECT_EQ(plan.shape_choice->chosen, PipelineShape::kInterleaved);
  ASSERT_EQ(plan.shape_choice->candidates.size(), 2u);  // with SI blocks and without
  EXPECT_NE(plan.shape_choice->candidates[0].si_blocks, plan.shape_choice->candidates[1].si_blocks);
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  const PlanScheme* megatron = plan.find_scheme(PipelineScheme::kMegatronInterleaved);
  ASSERT_TRUE(dhelix != nullptr && megatron != nullptr);
  EXPECT_EQ(dhelix->shape, PipelineShape::kInterleaved);
  EXPECT_EQ(dhelix->chunks_per_stage, 2);
  // The plain order is megatron-interleaved's own run: dhelix is never slower.
  EXPECT_LE(dhelix->iteration_us, megatron->iteration_us * (1 + 1e-12));
  // 16 layers, pp 2, v 2: virtual stage k holds layers 4k..4k+3; stage 0 chunks 0 and 2.
  ASSERT_EQ(plan.stages.size(), 2u);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> want = {{{0, 4}, {8, 4}},
                                                                      {{4, 4}, {12, 4}}};
  for (size_t p = 0; p < 2; ++p) {
    const PlanStage& stage = plan.stages[p];
    ASSERT_EQ(stage.model_chunks.size(), 2u);
    EXPECT_EQ(stage.down_layers.count + stage.up_layers.count, 0);
    for (size_t c = 0; c < 2; ++c) {
      EXPECT_EQ(stage.model_chunks[c].first, want[p][c].first);
      EXPECT_EQ(stage.model_chunks[c].count, want[p][c].second);
    }
    EXPECT_EQ(stage.embedding, p == 0);
    EXPECT_EQ(stage.head_loss, p == 1);
    for (const PlanTask& task : stage.tasks) {
      for (const auto* part : {&task.forward, &task.backward}) {
        if (!*part || task.kind == TaskKind::kHeadLoss) continue;
        ASSERT_TRUE((*part)->model_chunk.has_value()) << task.label;
        const PlanLayerRange& range =
            stage.model_chunks[static_cast<size_t>(*(*part)->model_chunk)];
        EXPECT_EQ((*part)->layers.first, range.first) << task.label;
        EXPECT_EQ((*part)->layers.count, range.count) << task.label;
      }
    }
  }
  // Chunk 0's forward on the last stage feeds chunk 1 on stage 0; the backward mirrors it.
  const auto find = [&](size_t stage, const std::string& label) -> const PlanTask& {
    for (const PlanTask& t : plan.stages[stage].tasks) {
      if (t.label == label || t.label.rfind(label + "+", 0) == 0 ||
          t.label.find("+" + label) != std::string::npos) {
        return t;
      }
    }
    ADD_FAILURE() << "no task " << label << " on stage " << stage;
    return plan.stages[stage].tasks.front();
  };
  const PlanTask& f01 = find(0, "F0.1");
  ASSERT_EQ(f01.waits_for.size(), 1u);
  EXPECT_EQ(f01.waits_for[0].stage, 1);
  EXPECT_EQ(&find(1, "F0.0"), &plan.stages[1].tasks[static_cast<size_t>(f01.waits_for[0].task)]);
  const PlanTask& b00 = find(1, "B0.0");
  bool waits_for_stage0 = false;
  for (const PlanTaskRef& ref : b00.waits_for) {
    if (ref.stage == 0) {
      waits_for_stage0 = true;
      EXPECT_EQ(&find(0, "B0.1"), &plan.stages[0].tasks[static_cast<size_t>(ref.task)]);
    }
  }
  EXPECT_TRUE(waits_for_stage0);
}

// Auto takes interleaved stages where they are fastest; a plan that takes the W or the V
// lists no interleaved candidate and keeps plan format 1.3.0.
TEST(InterleavedShape, AutoNeverLosesToMegatronInterleaved) {
  for (int64_t gbs : {4, 16}) {
    SCOPED_TRACE(fmt::format("m = {}", gbs));
    const Plan plan = plan_of(job_of(gbs), ShapeRequest::kAuto, 0);
    const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
    const PlanScheme* megatron = plan.find_scheme(PipelineScheme::kMegatronInterleaved);
    ASSERT_TRUE(dhelix != nullptr && megatron != nullptr);
    ASSERT_TRUE(dhelix->fits);
    EXPECT_LE(dhelix->iteration_us, megatron->iteration_us * (1 + 1e-12));
    const bool interleaved = plan.shape_choice->chosen == PipelineShape::kInterleaved;
    int64_t interleaved_candidates = 0;
    for (const PlanShapeCandidate& c : plan.shape_choice->candidates) {
      interleaved_candidates += c.shape == PipelineShape::kInterleaved ? 1 : 0;
      if (c.fits) {
        EXPECT_GE(c.iteration_us, plan.shape_choice->candidates.front().iteration_us);
      }
    }
    EXPECT_EQ(interleaved_candidates, interleaved ? 2 : 0);
    EXPECT_EQ(plan.schema_version, std::string(interleaved ? kPlanSchemaVersionInterleaved
                                                           : kPlanSchemaVersionWithoutFsdp));
  }
}

// The configuration search prunes with planner/search_bounds.h, whose dhelix bound takes
// the least of the W's and interleaved stages' (stage s waits only for the first chunks
// ahead of it): the interleaved plan must not beat it, or the search would prune a
// configuration whose interleaved plan is the best; and it stays within 2x of it. A bound
// 1.5x too high fails here; on this job the W's term is the lower one, so the interleaved
// term's own value is pinned by the next test. (The W's plans against the bound:
// config_search_test.cc, PrunedSearchFindsWhatPlanningEverythingFinds.)
TEST(InterleavedShape, SearchBoundHoldsForTheInterleavedShape) {
  const auto solo = [](const ClusterSpec& cluster, const Op& op) {
    return quantize_profile_value(op_time_us(cluster, op));  // as make_model_profile stores it
  };
  for (int64_t gbs : {4, 16}) {
    SCOPED_TRACE(fmt::format("m = {}", gbs));
    const JobSpec job = job_of(gbs);
    const Profile profile = make_model_profile(job, OrderedJson::object());
    const SchemeBounds bounds = lower_bounds(job, solo, &profile);
    const Plan plan = plan_of(job, ShapeRequest::kInterleaved, 0);
    const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
    ASSERT_NE(dhelix, nullptr);
    ASSERT_GT(dhelix->iteration_us, 0);
    EXPECT_LE(bounds.dhelix_us, dhelix->iteration_us);
    EXPECT_GT(bounds.dhelix_us, 0.5 * dhelix->iteration_us);
  }
}

// Where the interleaved term binds: a small model (llama-tiny's layer shape, 16 layers,
// sequence 256, no TP) on pp 2 with m = 64. The W's stage 0 runs the embedding and the
// head-loss step for every micro-batch, the interleaved stages split them over the first
// and the last stage and wait only for one 2-layer chunk ahead, so the interleaved plan
// (49.20 ms) is faster than the W's own bound (49.32 ms, the bound without the
// interleaved term, measured by removing it). The search must keep the bound at or below
// the interleaved plan, or it would prune the configuration whose best plan it is.
TEST(InterleavedShape, SearchBoundHoldsWhereTheInterleavedTermBinds) {
  const auto solo = [](const ClusterSpec& cluster, const Op& op) {
    return quantize_profile_value(op_time_us(cluster, op));
  };
  JobSpec job = test_jobs::llama8b_h100_job(2, 64, "interleaved-bound-test");
  job.model = read_model_file(std::string(DHELIX_SOURCE_DIR) + "/examples/models/llama-tiny.json");
  job.model.num_layers = 16;
  job.parallel.seq_length = 256;
  job.parallel.tp = 1;
  job.parallel.sp = false;
  const Profile profile = make_model_profile(job, OrderedJson::object());
  const SchemeBounds bounds = lower_bounds(job, solo, &profile);
  const Plan interleaved_plan = plan_of(job, ShapeRequest::kInterleaved, 0);
  const Plan w_plan = plan_of(job, ShapeRequest::kW, 0);
  const PlanScheme* interleaved = interleaved_plan.find_scheme(PipelineScheme::kDHelix);
  const PlanScheme* w = w_plan.find_scheme(PipelineScheme::kDHelix);
  ASSERT_TRUE(interleaved != nullptr && w != nullptr);
  EXPECT_LT(interleaved->iteration_us, w->iteration_us);  // the interleaved shape wins here
  EXPECT_LE(bounds.dhelix_us, interleaved->iteration_us);
  EXPECT_GT(bounds.dhelix_us, 0.95 * interleaved->iteration_us);
}

// With m = pp every stage's warm-up holds all its forwards (Megatron's rule), so the combined
// order pairs nothing: both candidates are the plain order, and say so.
TEST(InterleavedShape, NothingToPairWhenMicroBatchesEqualStages) {
  const Plan plan = plan_of(job_of(2), ShapeRequest::kInterleaved, 2);  // m = pp = 2
  ASSERT_EQ(plan.shape_choice->candidates.size(), 2u);
  for (const PlanShapeCandidate& c : plan.shape_choice->candidates) {
    EXPECT_FALSE(c.si_blocks);
    EXPECT_EQ(c.iteration_us, plan.shape_choice->candidates[0].iteration_us);
  }
  EXPECT_NE(plan.shape_choice->reason.find("without SI blocks"), std::string::npos)
      << plan.shape_choice->reason;
}

TEST(InterleavedShape, RefusedWithoutVirtualStages) {
  const JobSpec job = job_of(16);
  try {
    plan_of(job, ShapeRequest::kInterleaved, 1);
    FAIL() << "--shape interleaved planned with v = 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("--shape interleaved"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("v = 1"), std::string::npos) << e.what();
  }
  // Without interleaved stages auto does not try them, and the plan keeps its version.
  const Plan plan = plan_of(job, ShapeRequest::kAuto, 1);
  for (const PlanShapeCandidate& c : plan.shape_choice->candidates) {
    EXPECT_NE(c.shape, PipelineShape::kInterleaved);
  }
  EXPECT_EQ(plan.schema_version, std::string(kPlanSchemaVersionWithoutFsdp));
}

}  // namespace
}  // namespace dhelix
