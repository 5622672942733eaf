// Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers): the split of
// lib/stage_split.h, both layouts, the memory model's parameters and the W schedule's
// simulation with chunks of different sizes, each against hand arithmetic.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/stage_split.h"
#include "planner/folding.h"
#include "planner/memory_model.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {
namespace {

// Llama-3.1-405B as Meta trained it: 126 layers, pp 16, one layer fewer on the first and
// the last stage. Middle stages b = (126 - 7 - 7) / 14 = 8, chunks c = 4; the folded
// stage 0 keeps 7 - 4 = 3 layers in each chunk.
TEST(UnevenStages, Llama405bSplit) {
  std::string why;
  const auto split = split_stages(126, 16, 7, 7, why);
  ASSERT_TRUE(split) << why;
  EXPECT_EQ(split->middle_stage_layers, 8);
  std::vector<int64_t> unfolded(16, 8);
  unfolded.front() = 7;
  unfolded.back() = 7;
  EXPECT_EQ(split->unfolded, unfolded);
  std::vector<int64_t> chunks(32, 4);
  chunks.front() = 3;
  chunks.back() = 3;
  EXPECT_EQ(split->chunks, chunks);

  const FoldedLayout w = fold_layers(126, 16, 7, 7);
  EXPECT_EQ(w.layers_per_chunk, 4);
  EXPECT_EQ(w.stages[0].down.first, 0);
  EXPECT_EQ(w.stages[0].down.count, 3);
  EXPECT_EQ(w.stages[0].up.first, 123);
  EXPECT_EQ(w.stages[0].up.count, 3);
  EXPECT_EQ(w.stages[1].down.first, 3);
  EXPECT_EQ(w.stages[1].up.first, 119);
  EXPECT_EQ(w.stages[15].down.first, 59);
  EXPECT_EQ(w.stages[15].up.first, 63);
  EXPECT_EQ(w.stage_layers(0), 6);
  EXPECT_EQ(w.stage_layers(7), 8);
  EXPECT_EQ(w.stage_of_layer(2), 0);
  EXPECT_EQ(w.stage_of_layer(3), 1);
  EXPECT_EQ(w.stage_of_layer(125), 0);
  EXPECT_EQ(w.chunk_of_layer(124), ChunkSide::kUp);
  EXPECT_EQ(w.stage_of_layer(62), 15);

  const UnfoldedLayout u = unfold_layers(126, 16, 7, 7);
  EXPECT_EQ(u.stages[0].count, 7);
  EXPECT_EQ(u.stages[1].first, 7);
  EXPECT_EQ(u.stages[15].first, 119);
  EXPECT_EQ(u.stages[15].count, 7);
  EXPECT_EQ(u.stage_of_layer(118), 14);
  EXPECT_EQ(u.stage_of_layer(119), 15);
}

// One flag only: the others share the rest. L = 30, pp = 4, F = 6: b = 24/3 = 8, c = 4,
// stage 0's down chunk 6 - 4 = 2, up chunk 4 (La = b).
TEST(UnevenStages, FirstStageOnly) {
  std::string why;
  const auto split = split_stages(30, 4, 6, 0, why);
  ASSERT_TRUE(split) << why;
  EXPECT_EQ(split->unfolded, (std::vector<int64_t>{6, 8, 8, 8}));
  EXPECT_EQ(split->chunks, (std::vector<int64_t>{2, 4, 4, 4, 4, 4, 4, 4}));
}

TEST(UnevenStages, RulesNameTheNumbers) {
  std::string why;
  EXPECT_FALSE(split_stages(126, 16, 0, 0, why));  // 126 % 32 != 0
  EXPECT_EQ(why, "num_layers = 126 is not divisible by 2·pp = 32");
  EXPECT_FALSE(split_stages(126, 16, 8, 7, why));  // 111 over 14 stages
  EXPECT_EQ(why,
            "the 111 layers left after the first (8) and last (7) stages do not split evenly "
            "over the 14 middle stage(s)");
  EXPECT_FALSE(split_stages(36, 3, 9, 0, why));  // b = 27 / 2: not an integer
  EXPECT_FALSE(split_stages(30, 3, 6, 9, why));  // b = 15: odd
  EXPECT_EQ(why,
            "the middle stages hold 15 layers each, an odd count: model folding gives each of "
            "them two equal chunks");
  EXPECT_FALSE(split_stages(20, 3, 2, 2, why));  // b = 16, c = 8 > F
  EXPECT_EQ(why,
            "folding puts F - b/2 = -6 and La - b/2 = -6 layers in stage 0's two chunks (b = 16 "
            "layers per middle stage); both must be at least 1");
  EXPECT_FALSE(split_stages(16, 2, 8, 8, why));
  EXPECT_FALSE(split_stages(16, 1, 8, 0, why));
  EXPECT_THROW(fold_layers(126, 16, 8, 7), Error);
  EXPECT_THROW(unfold_layers(126, 16, 8, 7), Error);
}

// L = 10, pp = 3, F = La = 3: b = 4, c = 2; folded chunks 1,2,2 | 2,2,1 along the U.
// Parameters per GPU (tp 1): stage 0 of the W holds 2 layers with the embedding and the
// head; the 1F1B's stage 0 holds 3 layers and the embedding, stage 2 holds 3 and the head.
TEST(UnevenStages, StageParameters) {
  ModelSpec m;
  m.hidden_size = 64;
  m.ffn_hidden_size = 256;
  m.num_layers = 10;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.head_dim = 16;
  m.vocab_size = 100;
  ParallelSpec p;
  p.pp = 3;
  p.seq_length = 32;
  p.first_stage_layers = 3;
  p.last_stage_layers = 3;
  const int64_t layer = layer_parameter_count(m);  // 65664
  const int64_t vocab = 100 * 64;
  EXPECT_EQ(stage_layer_count(m, p, PipelineShape::kW, 0), 2);
  EXPECT_EQ(stage_layer_count(m, p, PipelineShape::kW, 2), 4);
  EXPECT_EQ(stage_layer_count(m, p, PipelineShape::kOneFOneB, 0), 3);
  EXPECT_EQ(stage_layer_count(m, p, PipelineShape::kOneFOneB, 1), 4);
  EXPECT_EQ(stage_parameters(m, p, PipelineShape::kW, 0).total(), 2 * layer + 2 * vocab + 64);
  EXPECT_EQ(stage_parameters(m, p, PipelineShape::kW, 1).total(), 4 * layer);
  EXPECT_EQ(stage_parameters(m, p, PipelineShape::kOneFOneB, 0).total(), 3 * layer + vocab);
  EXPECT_EQ(stage_parameters(m, p, PipelineShape::kOneFOneB, 2).total(), 3 * layer + vocab + 64);
}

// The W with a stage whose chunks differ: stage 0 has a 1-layer down chunk and a 2-layer
// up chunk (per layer: forward 1, backward 2, an SI pair 2.5), stage 1 two 2-layer chunks.
// m = 3, pp = 2 gives SI blocks F2d+B0u (1 pair + 1 backward layer alone: 2.5 + 2 = 4.5)
// and F2u+B0d (1 pair + 1 forward layer alone: 2.5 + 1 = 3.5) on stage 0. Every task must
// start after its inputs end, and stage 0's busy time is the hand sum:
//   forwards  F0d F1d (1 each), F0u F1u (2 each)                  = 6
//   SI blocks F2d+B0u 4.5, F2u+B0d 3.5                            = 8
//   backwards B1u B2u (4 each), B1d B2d (2 each)                  = 12   -> 26.
TEST(UnevenStages, WScheduleWithUnevenChunks) {
  StageCosts s0;
  s0.layers_per_chunk = 1;
  s0.up_layers = 2;
  s0.forward_chunk_us = 1;
  s0.backward_chunk_us = 2;
  s0.si_block_us = 2.5;
  s0.activation_bytes_per_layer = 10;
  StageCosts s1 = s0;
  s1.up_layers = 0;
  s1.layers_per_chunk = 2;
  s1.forward_chunk_us = 2;
  s1.backward_chunk_us = 4;
  s1.si_block_us = 5;
  const PipelineSchedule schedule = make_w_schedule(2, 3);
  const PipelineSimulation sim = simulate_pipeline(schedule, {s0, s1});
  EXPECT_DOUBLE_EQ(sim.stages[0].busy_us, 26);
  // Stage 1: four lone forwards (2), two SI blocks (5), four lone backwards (4).
  EXPECT_DOUBLE_EQ(sim.stages[1].busy_us, 4 * 2 + 2 * 5 + 4 * 4);
  for (int64_t p = 0; p < 2; ++p) {
    const auto& timeline = sim.stages[static_cast<size_t>(p)].timeline;
    for (size_t i = 0; i < timeline.size(); ++i) {
      if (i > 0) {
        EXPECT_GE(timeline[i].start_us, timeline[i - 1].end_us);
      }
      for (const WorkItem& w : task_work(timeline[i].task, p)) {
        for (const WorkItem& input : work_inputs(schedule, w)) {
          for (const TimelineEntry& e : sim.stages[static_cast<size_t>(input.stage)].timeline) {
            const auto done = task_work(e.task, input.stage);
            if (std::find(done.begin(), done.end(), input) != done.end()) {
              EXPECT_LE(e.end_us, timeline[i].start_us) << timeline[i].task.label();
            }
          }
        }
      }
    }
  }
  // Stage 0 keeps 10 bytes per down chunk, 20 per up chunk. Its order is F0d F1d F0u H0
  // F2d+B0u F1u H1 B1u F2u+B0d H2 B2u B1d B2d: 10, 20, 40, then F2d+B0u goes 40 -> 30 and
  // peaks one layer (10) above the larger: 50; F1u 50, B1u 30, F2u+B0d 30 -> 40 (peak 50).
  EXPECT_EQ(sim.stages[0].activation_curve.back().bytes, 0);
  EXPECT_EQ(sim.stages[0].peak_activation_bytes, 50);
}

}  // namespace
}  // namespace dhelix
