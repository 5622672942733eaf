// The planner's own uneven split (lib/stage_split_choice.h), Megatron's account_for flags
// and the interleaved model chunks (lib/stage_split.h), each against hand-worked cases; and
// Llama-3.1-405B planned on 512 H100s with TP 8, PP 8, CP 2 and VP 8.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/cluster_presets.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/stage_split.h"
#include "lib/stage_split_choice.h"
#include "planner/chosen_split.h"
#include "planner/folding.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/planner/model_plan.h"

namespace dhelix {
namespace {

using Chunks = std::vector<std::vector<int64_t>>;

// The file comment's case: 126 layers on 8 stages, a layer 1, embedding 0.1, head+loss 0.6.
TEST(StageSplitChoice, Llama405bOnEightStages) {
  std::string why;
  const auto chosen = choose_stage_split(126, 8, {1.0, 0.1, 0.6}, why);
  ASSERT_TRUE(chosen) << why;
  EXPECT_EQ(chosen->ends.first, 15);
  EXPECT_EQ(chosen->ends.last, 15);
  EXPECT_EQ(chosen->middle_layers, 16);
  EXPECT_DOUBLE_EQ(chosen->busiest_us, 16);  // W stage 0: 14 + 0.7; 1F1B ends 15.1, 15.6
}

// 30 layers on 4 stages (a GPT-style count 2·pp does not divide). F = La = (30 - 2b)/2:
// b = 8 gives F = La = 7, the W's stage 0 6 layers, busiest 8 (b = 6: F = 9, the W's stage
// 0 12; b = 10: F = 5, not above b/2). A head and loss worth 2 layers make the 1F1B's last
// stage 7 + 2 = 9, the busiest; F = 8, La = 6 would give 8, but its W stage 0 would hold
// chunks of 4 and 2 layers, which the plan's SI blocks cannot pair: F = La stays.
TEST(StageSplitChoice, ThirtyLayersOnFourStages) {
  std::string why;
  auto chosen = choose_stage_split(30, 4, {1.0, 0.0, 0.0}, why);
  ASSERT_TRUE(chosen) << why;
  EXPECT_EQ(chosen->ends.first, 7);
  EXPECT_EQ(chosen->ends.last, 7);
  EXPECT_EQ(chosen->middle_layers, 8);
  chosen = choose_stage_split(30, 4, {1.0, 0.0, 2.0}, why);
  ASSERT_TRUE(chosen) << why;
  EXPECT_EQ(chosen->ends.first, 7);
  EXPECT_EQ(chosen->ends.last, 7);
  EXPECT_DOUBLE_EQ(chosen->busiest_us, 9);
}

// An odd count has no F = La split: 31 layers on 4 stages range over every split. b = 8
// leaves F + La = 15 (F, La > 4); the 1F1B ends F and La, at most 8: F = 8, La = 7 and F =
// 7, La = 8 tie on everything but F: F = 7.
TEST(StageSplitChoice, OddCountFallsBackToUnequalEnds) {
  std::string why;
  const auto chosen = choose_stage_split(31, 4, {1.0, 0.0, 0.0}, why);
  ASSERT_TRUE(chosen) << why;
  EXPECT_EQ(chosen->ends.first, 7);
  EXPECT_EQ(chosen->ends.last, 8);
  EXPECT_EQ(chosen->middle_layers, 8);
}

// pp = 2 sets one end: 6 layers, b = 2 (b = 4 leaves F = 2, not above b/2). The W's stage 0
// holds 4 layers either way; the 1F1B's busier end is the lighter with F = 4 (4.1 against
// 4.6 with La = 4, when the head weighs more than the embedding).
TEST(StageSplitChoice, TwoStagesSetOneEnd) {
  std::string why;
  const auto chosen = choose_stage_split(6, 2, {1.0, 0.1, 0.6}, why);
  ASSERT_TRUE(chosen) << why;
  EXPECT_EQ(chosen->ends.first, 4);
  EXPECT_EQ(chosen->ends.last, 0);
  EXPECT_EQ(chosen->middle_layers, 2);
}

TEST(StageSplitChoice, NoSplitForTooManyStages) {
  std::string why;
  EXPECT_FALSE(choose_stage_split(10, 8, {}, why));
  EXPECT_NE(why.find("num_layers >= 2·pp = 16"), std::string::npos) << why;
}

// any_stage_split's closed form against every F and La the rules of split_stages allow.
TEST(StageSplitChoice, AnySplitMatchesEveryEnd) {
  for (int64_t layers = 1; layers <= 40; ++layers) {
    for (int64_t pp = 1; pp <= 12; ++pp) {
      bool found = false;
      std::string why;
      for (int64_t f = 0; f < layers && !found; ++f) {
        for (int64_t la = 0; f + la <= layers && !found; ++la) {
          found = split_stages(layers, pp, f, la, why).has_value();
        }
      }
      EXPECT_EQ(any_stage_split(layers, pp), found) << layers << " layers, pp " << pp;
    }
  }
}

// Megatron's account_for flags: 126 + 2 counted layers, 16 per stage, F = La = 15; folded,
// stage 0 holds 7 + 7 and every other stage 8 + 8.
TEST(AccountForFlags, Llama405bEnds) {
  ParallelSpec p;
  p.pp = 8;
  p.account_for_embedding = true;
  p.account_for_loss = true;
  std::string why;
  const auto ends = stage_ends(126, p, why);
  ASSERT_TRUE(ends) << why;
  EXPECT_EQ(ends->first, 15);
  EXPECT_EQ(ends->last, 15);
  const FoldedLayout folded = fold_job_layers(126, p);
  EXPECT_EQ(folded.stages[0].down.count, 7);
  EXPECT_EQ(folded.stages[0].up.count, 7);
  EXPECT_EQ(folded.stages[1].down.count, 8);
  EXPECT_EQ(folded.stage_layers(7), 16);
  const UnfoldedLayout unfolded = unfold_job_layers(126, p);
  EXPECT_EQ(unfolded.stages[0].count, 15);
  EXPECT_EQ(unfolded.stages[7].count, 15);
  EXPECT_EQ(unfolded.stages[3].count, 16);
  // Only the embedding: 127 layers, (127 + 1) / 8 = 16, F = 15, the last stage a middle one.
  p.account_for_loss = false;
  EXPECT_EQ(stage_ends(127, p, why)->first, 15);
  EXPECT_EQ(stage_ends(127, p, why)->last, 0);
  EXPECT_FALSE(stage_ends(126, p, why));  // 127 / 8
  p.first_stage_layers = 15;
  EXPECT_FALSE(stage_ends(127, p, why));  // Megatron: not with decoder_first_...
  EXPECT_NE(why.find("together with decoder_first/last"), std::string::npos) << why;
}

// Interleaved model chunks as Megatron builds them.
TEST(AccountForFlags, InterleavedChunks) {
  ParallelSpec p;
  p.pp = 8;
  p.account_for_embedding = true;
  p.account_for_loss = true;
  std::string why;
  const auto chunks = interleaved_stage_layers(126, p, 8, why);
  ASSERT_TRUE(chunks) << why;
  EXPECT_EQ((*chunks)[0], (std::vector<int64_t>{1, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ((*chunks)[3], std::vector<int64_t>(8, 2));
  EXPECT_EQ((*chunks)[7], (std::vector<int64_t>{2, 2, 2, 2, 2, 2, 2, 1}));
  EXPECT_FALSE(interleaved_stage_layers(126, p, 3, why));   // 16 per stage
  EXPECT_FALSE(interleaved_stage_layers(126, p, 16, why));  // a first chunk of 0 layers
  // decoder_first/last: every stage's count divides by v. 7 + 14·8 + 7 on pp 16: v = 7 no
  // (the middle 8), v = 2 no (the ends 7).
  ParallelSpec q;
  q.pp = 16;
  q.first_stage_layers = 7;
  q.last_stage_layers = 7;
  EXPECT_FALSE(interleaved_stage_layers(126, q, 2, why));
  EXPECT_NE(why.find("stage 0 holds 7"), std::string::npos) << why;
  q.first_stage_layers = 6;  // 6 + 14·8 + 8 = 126
  q.last_stage_layers = 8;
  EXPECT_EQ(*interleaved_stage_layers(126, q, 2, why), (Chunks{{3, 3},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4},
                                                               {4, 4}}));
}

JobSpec llama_405b_job() {
  JobSpec job;
  job.model = read_model_file(std::string(DHELIX_SOURCE_DIR) +
                              "/examples/models/hf/llama-3.1-405b.config.json");
  job.cluster = find_cluster_preset("h100").value();
  job.name = "llama-3.1-405b-tp8-pp8-cp2-vp8";
  ParallelSpec& p = job.parallel;
  p.tp = 8;
  p.sp = true;
  p.cp = 2;
  p.pp = 8;
  p.dp = 4;  // 512 GPUs
  p.micro_batch_size = 1;
  p.global_batch_size = 256;
  p.seq_length = 8192;
  return job;
}

PlanResult plan_of(const JobSpec& job, int64_t virtual_pipeline) {
  return test_jobs::model_plan_result(job, {.virtual_pipeline_size = virtual_pipeline});
}

// The acceptance case: 126 layers on PP 8 with VP 8 plan with Megatron's flags (2
// layers per model chunk, 1 in stage 0's first and stage 7's last) and, without them, with
// the planner's own split (F = La = 15 here too), where Megatron cannot interleave 15-layer
// ends and 16-layer middles by any v > 1: a requested VP 8 is refused by name, and the
// default runs plain 1F1B.
TEST(StageSplitChoice, Llama405bPlansOnPp8Vp8) {
  JobSpec job = llama_405b_job();
  job.parallel.account_for_embedding = true;
  job.parallel.account_for_loss = true;
  ASSERT_TRUE(validate_job(job).empty());
  const PlanResult flagged = plan_of(job, 8);
  const Plan& plan = flagged.plan;
  ASSERT_EQ(plan.stages.size(), 8u);
  for (const PlanScheme& s : plan.schemes) {
    EXPECT_GT(s.iteration_us, 0) << pipeline_scheme_name(s.scheme);
    if (s.scheme == PipelineScheme::kMegatronInterleaved) {
      EXPECT_EQ(s.chunks_per_stage, 8);
    }
  }

  job.parallel.account_for_embedding = false;
  job.parallel.account_for_loss = false;
  ASSERT_TRUE(validate_job(job).empty());
  const PlanResult chosen = plan_of(job, 0);
  EXPECT_EQ(chosen.plan.job.parallel["decoder_first_pipeline_num_layers"], 15);
  EXPECT_EQ(chosen.plan.job.parallel["decoder_last_pipeline_num_layers"], 15);
  ASSERT_FALSE(chosen.warnings.empty());
  EXPECT_NE(chosen.warnings.front().find("the planner chose uneven stages"), std::string::npos);
  for (const PlanScheme& s : chosen.plan.schemes) {
    if (s.scheme == PipelineScheme::kMegatronInterleaved) {
      EXPECT_EQ(s.chunks_per_stage, 1);
    }
  }
  try {
    plan_of(job, 8);
    ADD_FAILURE() << "VP 8 over 15-layer ends should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Megatron refuses it"), std::string::npos) << e.what();
  }
}

// A GPT-style count that does not fold (30 layers, pp 4) plans with the chosen split, and
// the plan's layers add up on both layouts.
TEST(StageSplitChoice, UnfoldableGptPlans) {
  JobSpec job;
  job.model = read_model_file(std::string(DHELIX_SOURCE_DIR) + "/examples/models/gpt-6.7b.json");
  job.model.num_layers = 30;
  job.cluster = find_cluster_preset("h100").value();
  job.name = "gpt-30-layers-pp4";
  job.parallel.tp = 4;
  job.parallel.sp = true;
  job.parallel.pp = 4;
  job.parallel.micro_batch_size = 1;
  job.parallel.global_batch_size = 8;
  job.parallel.seq_length = 2048;
  ASSERT_TRUE(validate_job(job).empty());
  const PlanResult result = plan_of(job, 0);
  const JobSpec planned =
      with_planned_split(job, [&job](const Op& op) { return op_time_us(job.cluster, op); });
  EXPECT_GT(planned.parallel.first_stage_layers + planned.parallel.last_stage_layers, 0);
  int64_t folded = 0;
  for (const PlanStage& stage : result.plan.stages) {
    folded += stage.down_layers.count + stage.up_layers.count;
  }
  EXPECT_EQ(folded, 30);
}

}  // namespace
}  // namespace dhelix
