#include "planner/pipeline_simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

// Chunk costs for every stage: forward f, backward b, SI block si, no transfer delay.
std::vector<StageCosts> uniform(int64_t pp, double f, double b, double si) {
  StageCosts c;
  c.forward_chunk_us = f;
  c.backward_chunk_us = b;
  c.si_block_us = si;
  return std::vector<StageCosts>(static_cast<size_t>(pp), c);
}

std::string timeline_text(const StageSimulation& stage) {
  std::string text;
  for (const TimelineEntry& e : stage.timeline) {
    if (!text.empty()) text += " ";
    text += e.task.label() + "@" + std::to_string(static_cast<int>(e.start_us * 2));
  }
  return text;
}

// W, pp = 2, m = 4, forward and backward chunks 1, SI blocks 2. Times (start, end):
//   stage 0: F0d 0-1, F1d 1-2, F0u 3-4 (waits for stage 1's F0u, ends 3), H0 4-4,
//            F2d+B0u 4-6, F1u 6-7 (stage 1's F1u ended 5), H1 7, F3d+B1u 7-9,
//            F2u+B0d 10-12 (stage 1's ended 10), H2 12, B2u 12-13, F3u+B1d 14-16,
//            H3 16, B3u 16-17, B2d 17-18 (stage 1's B2d ended 16), B3d 19-20.
//   stage 1: F0d 1-2, F0u 2-3, F1d 3-4, F1u 4-5, F2d+B0u 6-8, F2u+B0d 8-10,
//            F3d+B1u 10-12 (stage 0's ended 9), F3u+B1d 12-14, B2u 14-15 (stage 0's
//            ended 13), B2d 15-16, B3u 17-18, B3d 18-19.
// Iteration 20; each stage is busy 4·1 + 4·1 + 4·2 = 16, bubble 4/20 = 0.2.
TEST(PipelineSimulator, HandTimedW) {
  const PipelineSimulation sim = simulate_pipeline(make_w_schedule(2, 4), uniform(2, 1, 1, 2));
  EXPECT_DOUBLE_EQ(sim.iteration_us, 20);
  EXPECT_DOUBLE_EQ(sim.pipeline_us, 20);
  EXPECT_DOUBLE_EQ(sim.bubble_ratio, 0.2);
  // Start times in half units.
  EXPECT_EQ(timeline_text(sim.stages[0]),
            "F0d@0 F1d@2 F0u@6 H0@8 F2d+B0u@8 F1u@12 H1@14 F3d+B1u@14 F2u+B0d@20 H2@24 B2u@24 "
            "F3u+B1d@28 H3@32 B3u@32 B2d@34 B3d@38");
  EXPECT_EQ(timeline_text(sim.stages[1]),
            "F0d@2 F0u@4 F1d@6 F1u@8 F2d+B0u@12 F2u+B0d@16 F3d+B1u@20 F3u+B1d@24 B2u@28 "
            "B2d@30 B3u@34 B3d@36");
}

// 1F1B, pp = 2, m = 4, stages of two chunks: forward 2, backward 2.
//   stage 0: F0 0-2, F1 2-4, B0 6-8 (stage 1's B0 ended 6), F2 8-10, B1 10-12, F3 12-14,
//            B2 14-16, B3 18-20.
//   stage 1: F0 2-4, H0, B0 4-6, F1 6-8, B1 8-10, F2 10-12, B2 12-14, F3 14-16, B3 16-18.
// (m + pp - 1)·(F + B) = 5·4 = 20.
TEST(PipelineSimulator, HandTimedOneFOneB) {
  const PipelineSimulation sim =
      simulate_pipeline(make_one_f_one_b_schedule(2, 4), uniform(2, 2, 2, 0));
  EXPECT_DOUBLE_EQ(sim.iteration_us, 20);
  EXPECT_DOUBLE_EQ(sim.bubble_ratio, 0.2);
  EXPECT_EQ(timeline_text(sim.stages[0]), "F0@0 F1@4 B0@12 F2@16 B1@20 F3@24 B2@28 B3@36");
}

// SI blocks of 1.5 instead of 2: stage 0 runs F0d 0-1, F1d 1-2, F0u 3-4, F2d+B0u 4-5.5,
// F1u 5.5-6.5, F3d+B1u 6.5-8, F2u+B0d 8.5-10, B2u 10-11, F3u+B1d 11.5-13, B3u 13-14,
// B2d 14-15, B3d 16-17; stage 1 ends with B3d 15-16. Iteration 17 < 20.
TEST(PipelineSimulator, CheaperSiBlocksShortenTheW) {
  const PipelineSimulation sim = simulate_pipeline(make_w_schedule(2, 4), uniform(2, 1, 1, 1.5));
  EXPECT_DOUBLE_EQ(sim.iteration_us, 17);
  EXPECT_DOUBLE_EQ(sim.stages[1].last_end_us, 16);
}

// The paper (section 4.1): the W does not change the bubble ratio. With SI blocks costing
// exactly forward + backward, the W equals 1F1B on stages of two chunks whenever there are
// more micro-batches than stages (and for one), with backward twice the forward too, and
// any cheaper SI block shortens the iteration. With 2 <= m <= pp there is no SI block and
// the W, whose lone tasks are half-stage chunks, fills and drains the pipeline faster, as
// interleaved 1F1B does: pp 2, m 2 takes 16 against 18.
TEST(PipelineSimulator, WKeepsTheBubbleRatioOfOneFOneB) {
  for (int64_t pp = 1; pp <= 5; ++pp) {
    for (int64_t m = 1; m <= 12; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      const PipelineSimulation w = simulate_pipeline(make_w_schedule(pp, m), uniform(pp, 1, 2, 3));
      const PipelineSimulation one =
          simulate_pipeline(make_one_f_one_b_schedule(pp, m), uniform(pp, 2, 4, 0));
      EXPECT_DOUBLE_EQ(one.iteration_us, static_cast<double>(m + pp - 1) * 6);
      if (m == 1 || m > pp) {
        EXPECT_DOUBLE_EQ(w.iteration_us, one.iteration_us);
        EXPECT_DOUBLE_EQ(w.bubble_ratio, one.bubble_ratio);
      } else {  // no SI block; the W's half-size chunks fill the pipeline finer
        EXPECT_LT(w.iteration_us, one.iteration_us);
        EXPECT_LT(w.bubble_ratio, one.bubble_ratio);
        if (pp == 2) {
          EXPECT_DOUBLE_EQ(w.iteration_us, 16);
        }
      }
      EXPECT_DOUBLE_EQ(one.bubble_ratio,
                       static_cast<double>(pp - 1) / static_cast<double>(m + pp - 1));
      const PipelineSimulation cheaper =
          simulate_pipeline(make_w_schedule(pp, m), uniform(pp, 1, 2, 2.4));
      if (m > pp) {
        EXPECT_LT(cheaper.iteration_us, w.iteration_us);
      } else {
        EXPECT_DOUBLE_EQ(cheaper.iteration_us, w.iteration_us);  // no SI block to speed up
      }
    }
  }
}

// Every task starts after its stage's previous task and after each input has ended and,
// from another stage, travelled p2p_us.
TEST(PipelineSimulator, DependenciesRespected) {
  for (PipelineShape shape : {PipelineShape::kW, PipelineShape::kOneFOneB}) {
    for (int64_t pp = 1; pp <= 5; ++pp) {
      for (int64_t m = 1; m <= 9; ++m) {
        const PipelineSchedule schedule = make_schedule(shape, pp, m);
        std::vector<StageCosts> costs;
        for (int64_t p = 0; p < pp; ++p) {
          StageCosts c;
          c.forward_chunk_us = 1.0 + 0.1 * static_cast<double>(p);
          c.backward_chunk_us = 2.3 - 0.2 * static_cast<double>(p);
          c.si_block_us = 2.9;
          c.head_loss_forward_us = 0.4;
          c.head_loss_backward_us = 0.3;
          c.embedding_forward_us = 0.2;
          c.embedding_backward_us = 0.1;
          c.p2p_us = 0.25 * static_cast<double>(p + 1);
          costs.push_back(c);
        }
        const PipelineSimulation sim = simulate_pipeline(schedule, costs);
        std::map<std::tuple<WorkPass, int64_t, ChunkSide, int64_t>, double> ends;
        for (int64_t p = 0; p < pp; ++p) {
          for (const TimelineEntry& e : sim.stages[p].timeline) {
            for (const WorkItem& w : task_work(e.task, p)) {
              ends[{w.pass, w.micro_batch, w.chunk, w.stage}] = e.end_us;
            }
          }
        }
        for (int64_t p = 0; p < pp; ++p) {
          double previous_end = 0;
          for (const TimelineEntry& e : sim.stages[p].timeline) {
            EXPECT_GE(e.start_us, previous_end);
            previous_end = e.end_us;
            for (const WorkItem& w : task_work(e.task, p)) {
              for (const WorkItem& in : work_inputs(schedule, w)) {
                const double delay = in.stage == p ? 0.0 : costs[in.stage].p2p_us;
                EXPECT_GE(e.start_us + 1e-9,
                          ends.at({in.pass, in.micro_batch, in.chunk, in.stage}) + delay)
                    << pipeline_shape_name(shape) << " pp " << pp << " m " << m << " "
                    << e.task.label();
              }
            }
          }
        }
      }
    }
  }
}

// One activation per hop forward and one gradient per hop backward: 1F1B moves 2·(pp-1)
// per micro-batch, the W, going down and up, 4·(pp-1).
TEST(PipelineSimulator, WDoublesPointToPointTransfers) {
  for (int64_t pp = 1; pp <= 5; ++pp) {
    std::vector<StageCosts> costs = uniform(pp, 1, 2, 3);
    for (StageCosts& c : costs) c.p2p_bytes = 1000;
    const PipelineSimulation w = simulate_pipeline(make_w_schedule(pp, 6), costs);
    const PipelineSimulation one = simulate_pipeline(make_one_f_one_b_schedule(pp, 6), costs);
    EXPECT_EQ(one.p2p_transfers, 2 * (pp - 1) * 6);
    EXPECT_EQ(w.p2p_transfers, 2 * one.p2p_transfers);
    EXPECT_EQ(w.p2p_bytes, 2 * one.p2p_bytes);
    EXPECT_EQ(w.p2p_bytes, 1000 * w.p2p_transfers);
  }
}

// 1F1B, pp = 2, m = 1, chunks 2 / 2, transfers 0.5, DP reduction 3, optimizer 1:
// stage 0 F0 0-2; stage 1 F0 2.5-4.5 (0.5 exposed), B0 4.5-6.5; stage 0 B0 7-9 (0.5
// exposed). Stage 0 finishes at 9 + 3 + 1 = 13, stage 1 at 6.5 + 4 = 10.5.
TEST(PipelineSimulator, TransfersDpAndOptimizer) {
  std::vector<StageCosts> costs = uniform(2, 2, 2, 0);
  for (StageCosts& c : costs) {
    c.p2p_us = 0.5;
    c.dp_reduce_us = 3;
    c.optimizer_us = 1;
    c.forward_comm[ParallelDim::kTp] = CommTime{0.25, 0.5};
  }
  const PipelineSimulation sim = simulate_pipeline(make_one_f_one_b_schedule(2, 1), costs);
  EXPECT_DOUBLE_EQ(sim.pipeline_us, 9);
  EXPECT_DOUBLE_EQ(sim.iteration_us, 13);
  EXPECT_DOUBLE_EQ(sim.stages[1].finish_us, 10.5);
  EXPECT_DOUBLE_EQ(sim.comm[ParallelDim::kPp].exposed_us, 1.0);
  EXPECT_DOUBLE_EQ(sim.comm[ParallelDim::kPp].hidden_us, 0.0);
  EXPECT_DOUBLE_EQ(sim.comm[ParallelDim::kDp].exposed_us, 6.0);
  EXPECT_DOUBLE_EQ(sim.comm[ParallelDim::kTp].hidden_us, 0.5);  // two forwards
  EXPECT_DOUBLE_EQ(sim.comm[ParallelDim::kTp].exposed_us, 1.0);
  EXPECT_EQ(sim.p2p_transfers, 2);
  // pp = 2, m = 2: stage 1's F1 input arrives at 4.5 while stage 1 runs B0 until 6.5: hidden.
  const PipelineSimulation two = simulate_pipeline(make_one_f_one_b_schedule(2, 2), costs);
  EXPECT_DOUBLE_EQ(two.comm[ParallelDim::kPp].hidden_us, 0.5);
}

// pp 1, m 1: F0 charges 2 layers of 3 bytes at 0; H0 (1-2) holds 10 bytes of logits on top;
// B0 (2-3) releases the 6 bytes at its end.
TEST(PipelineSimulator, ActivationCurve) {
  std::vector<StageCosts> costs = uniform(1, 1, 1, 0);
  costs[0].layers_per_chunk = 2;
  costs[0].activation_bytes_per_layer = 3;
  costs[0].head_loss_transient_bytes = 10;
  costs[0].head_loss_forward_us = 0.5;
  costs[0].head_loss_backward_us = 0.5;
  const PipelineSimulation sim = simulate_pipeline(make_one_f_one_b_schedule(1, 1), costs);
  std::string curve;
  for (const MemoryPoint& point : sim.stages[0].activation_curve) {
    curve +=
        std::to_string(static_cast<int>(point.time_us)) + ":" + std::to_string(point.bytes) + " ";
  }
  EXPECT_EQ(curve, "0:6 1:16 2:6 3:0 ");
  EXPECT_EQ(sim.stages[0].peak_activation_bytes, 16);
  EXPECT_DOUBLE_EQ(sim.stages[0].peak_activation_time_us, 1);
}

TEST(PipelineSimulator, RejectsBadCosts) {
  try {
    simulate_pipeline(make_w_schedule(2, 2), uniform(3, 1, 1, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "pipeline simulation: 3 stage costs given for pp = 2");
  }
  EXPECT_THROW(simulate_pipeline(make_w_schedule(2, 2), uniform(2, -1, 1, 1)), Error);
}

TEST(PipelineSimulator, RejectsInfiniteAndNanTaskTimes) {
  const auto message = [](double f) {
    try {
      simulate_pipeline(make_w_schedule(2, 2), uniform(2, f, 1, 1));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(std::numeric_limits<double>::infinity()),
            "pipeline simulation: stage 0: a task time is inf us; times must be finite and "
            "non-negative");
  EXPECT_EQ(message(std::nan("")),
            "pipeline simulation: stage 0: a task time is nan us; times must be finite and "
            "non-negative");
  EXPECT_EQ(message(-1),
            "pipeline simulation: stage 0: a task time is -1 us; times must be finite and "
            "non-negative");
}

}  // namespace
}  // namespace dhelix
