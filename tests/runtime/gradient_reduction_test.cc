// The bucketed, overlapped gradient reduction (runtime/train/gradient_reduction.h) and the
// op -> gradient table it reads (runtime/model/gradient_writers.h), without mpirun: ranks
// are threads of one LoopbackWorld.
//   * the table: on dense TP x PP, CP, full recompute, MoE with EP and TP and a MoE layer
//     with a shared expert, every instruction changes only the gradients the table names
//     for it, and no gradient changes after the instruction the reducer takes as its last
//     writer (an early bucket would sum a gradient still being written);
//   * the parameter gathers' waits: with every parameter an instruction may not read set to
//     NaN while it runs, the losses and gradients keep every bit;
//   * the buckets follow the order in which gradients become final, experts apart under EP;
//   * overlapped, small buckets give the same bits as the per-parameter sums after the
//     iteration (synchronise_gradients), on DP 2 x TP 2 and on MoE EP 2 x DP 2.
#include "runtime/train/gradient_reduction.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/placement.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "runtime/comm/loopback_communicator.h"
#include "runtime/comm/process_groups.h"
#include "runtime/model/gradient_writers.h"
#include "runtime/train/context_split.h"
#include "runtime/train/optimizer.h"
#include "tests/device/plan_in_process.h"
#include "tests/runtime/loopback_directory.h"
#include "tests/runtime/shipped_plan.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

TEST(GradientWriters, NameLayerAndExtraParameters) {
  EXPECT_EQ(gradients_written_by("bwd.qkv_wgrad", 3), std::vector<std::string>{"layers.3.w_qkv"});
  EXPECT_EQ(gradients_written_by("bwd.shared_fc2_dgrad", 0),
            std::vector<std::string>{"layers.0.shared_gate"});
  EXPECT_EQ(gradients_written_by("bwd.head_wgrad", -1), std::vector<std::string>{"head"});
  EXPECT_TRUE(gradients_written_by("bwd.qkv_dgrad", 3).empty());
  EXPECT_TRUE(gradients_written_by("fwd.gemm_qkv", 3).empty());
  EXPECT_TRUE(gradients_written_by("bwd.head_wgrad", 2).empty());  // not a layer op
}

TEST(ReductionBuckets, FollowTheOrderInWhichGradientsBecomeFinal) {
  // Parameters of 3, 5, 2, 9 elements, final after instructions 7, 2, 9, 4: in that order
  // 5 (p1), 9 (p3), 3 (p0), 2 (p2), cut at 8 elements.
  const auto buckets =
      plan_reduction_buckets({3, 5, 2, 9}, {false, false, false, false}, {7, 2, 9, 4}, 8, false);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].parameters, (std::vector<int64_t>{1}));
  EXPECT_EQ(buckets[1].parameters, (std::vector<int64_t>{3}));
  EXPECT_EQ(buckets[2].parameters, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(buckets[2].offsets, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(buckets[2].elements, 5);
  EXPECT_EQ(buckets[0].completed_by, 2);
  EXPECT_EQ(buckets[1].completed_by, 4);
  EXPECT_EQ(buckets[2].completed_by, 9);
}

TEST(ReductionBuckets, ExpertsGetBucketsOfTheirOwnUnderExpertParallelism) {
  const std::vector<bool> expert = {false, true, true, false};
  const std::vector<int64_t> last = {1, 2, 3, 4};
  const auto apart = plan_reduction_buckets({2, 2, 2, 2}, expert, last, 100, true);
  ASSERT_EQ(apart.size(), 2u);
  EXPECT_EQ(apart[0].parameters, (std::vector<int64_t>{1, 2}));  // complete at 3
  EXPECT_TRUE(apart[0].expert);
  EXPECT_EQ(apart[1].parameters, (std::vector<int64_t>{0, 3}));  // complete at 4
  EXPECT_FALSE(apart[1].expert);
  const auto together = plan_reduction_buckets({2, 2, 2, 2}, expert, last, 100, false);
  ASSERT_EQ(together.size(), 1u);
  EXPECT_EQ(together[0].parameters, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(ReductionBuckets, RefuseABucketSizeBelowOne) {
  EXPECT_THROW(plan_reduction_buckets({1}, {false}, {0}, 0, false), Error);
}

// tiny-moe-ep2-tp2's job with a shared expert (no shipped plan has one), planned here.
PlannedJob shared_expert_job() {
  JobSpec job =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-moe-ep2-tp2.json");
  job.model.moe->shared_expert_ffn_hidden_size = 64;
  validate_job(job).throw_if_any();
  PlannedJob p;
  p.plan = cuda::testing::plan_in_process(job, "shared-expert.json");
  p.job = job_from_plan(p.plan, "shared-expert.json");
  return p;
}

std::unique_ptr<StageModel> make_model(const PlannedJob& p, const Placement& placement,
                                       int64_t rank, int64_t stage_index) {
  const PlanStage& stage = p.plan.stages.at(static_cast<size_t>(stage_index));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
    if (range.count > 0) ranges.emplace_back(range.first, range.count);
  }
  auto model =
      std::make_unique<StageModel>(p.job, rank, ranges, stage.embedding, stage.head_loss, 11);
  const ParallelSpec& par = p.job.parallel;
  model->start_iteration(p.plan.num_micro_batches);
  model->set_loss_scale(1.0f / static_cast<float>(p.plan.num_micro_batches * par.micro_batch_size *
                                                  par.seq_length * par.dp));
  const RankCoordinates c = placement.coordinates(rank);
  for (int64_t mb = 0; mb < p.plan.num_micro_batches; ++mb) {
    MicroBatchTokens tokens =
        test::random_tokens(par.micro_batch_size * par.seq_length, p.job.model.vocab_size,
                            static_cast<uint32_t>(500 + 31 * c.dp + mb));
    if (par.cp > 1) {
      tokens = context_parallel_share(tokens, par.micro_batch_size, par.seq_length, par.cp, c.cp);
    }
    model->set_tokens(mb, std::move(tokens));
  }
  return model;
}

// Runs `body(rank)` on a thread per rank; returns each rank's error ("" when none).
template <class Body>
std::vector<std::string> on_every_rank(int64_t ranks, Body&& body) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& error) {
        errors[static_cast<size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

// "tiny-tp2-pp2" -> "tiny_tp2_pp2" (a GoogleTest name).
std::string test_name(std::string plan) {
  std::replace(plan.begin(), plan.end(), '-', '_');
  return plan;
}

class GradientWritersMatchTheModel : public ::testing::TestWithParam<std::string> {};

// One sequential iteration per rank; after each instruction, which gradients changed.
TEST_P(GradientWritersMatchTheModel, InstructionByInstruction) {
  const PlannedJob p = GetParam() == "shared-expert" ? shared_expert_job() : shipped(GetParam());
  const Placement placement(p.job.parallel, p.job.cluster.gpus_per_node);
  LoopbackWorld world(placement.world_size());
  std::vector<std::vector<std::string>> problems(static_cast<size_t>(placement.world_size()));
  const auto errors = on_every_rank(placement.world_size(), [&](int64_t rank) {
    const RankProgram program = lower_rank_program(p.plan, p.job, rank, ExecutionMode::kSequential);
    std::unique_ptr<StageModel> model = make_model(p, placement, rank, program.stage);
    const std::vector<ParameterView> params = model->parameters();
    std::vector<std::string> names;
    for (const ParameterView& v : params) names.push_back(v.name);
    const std::vector<int64_t> last_writer = last_gradient_writers(names, program);
    std::vector<std::vector<float>> before;
    for (const ParameterView& v : params) before.emplace_back(v.gradient, v.gradient + v.count);
    std::vector<int64_t> last_change(params.size(), -1);
    std::vector<std::string>& out = problems[static_cast<size_t>(rank)];
    ExecutionOptions options;
    options.on_instruction_done = [&](size_t index) {
      const Instruction& in = program.instructions[index];
      const std::vector<std::string> listed = gradients_written_by(in.op, in.layer);
      for (size_t i = 0; i < params.size(); ++i) {
        const ParameterView& v = params[i];
        if (std::equal(before[i].begin(), before[i].end(), v.gradient)) continue;
        before[i].assign(v.gradient, v.gradient + v.count);
        last_change[i] = static_cast<int64_t>(index);
        if (std::find(listed.begin(), listed.end(), v.name) == listed.end()) {
          out.push_back(std::string(in.op) + " (layer " + std::to_string(in.layer) +
                        ") changed the gradient of " + v.name + ", which the table omits");
        }
      }
    };
    LoopbackDirectory comms(world, placement, rank, "writers/");
    execute_program(p.plan, program, *model, comms, std::move(options));
    for (size_t i = 0; i < params.size(); ++i) {
      if (last_writer[i] < 0) out.push_back("no instruction writes " + names[i]);
      if (last_change[i] < 0) out.push_back("the gradient of " + names[i] + " never changed");
      if (last_change[i] > last_writer[i]) {
        out.push_back(names[i] + " changed after its last writer");
      }
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    for (const std::string& problem : problems[r]) ADD_FAILURE() << "rank " << r << ": " << problem;
  }
}

// Each rank's losses and gradients after one sequential iteration; with `poison`, every
// parameter an instruction may not read (read_key_of_*) holds NaN while it runs.
std::vector<std::vector<std::vector<float>>> outputs(const PlannedJob& p, bool poison,
                                                     const std::string& run) {
  const Placement placement(p.job.parallel, p.job.cluster.gpus_per_node);
  LoopbackWorld world(placement.world_size());
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(placement.world_size()));
  const auto errors = on_every_rank(placement.world_size(), [&](int64_t rank) {
    const RankProgram program = lower_rank_program(p.plan, p.job, rank, ExecutionMode::kSequential);
    std::unique_ptr<StageModel> model = make_model(p, placement, rank, program.stage);
    const std::vector<ParameterView> params = model->parameters();
    std::vector<std::vector<float>> saved(params.size());
    ExecutionOptions options;
    if (poison) {
      options.before_instruction = [&](size_t index) {
        const std::optional<int64_t> key = read_key_of_instruction(program.instructions[index]);
        for (size_t i = 0; i < params.size(); ++i) {
          if (key && read_key_of_parameter(params[i].name) == *key) continue;
          saved[i].assign(params[i].values, params[i].values + params[i].count);
          std::fill(params[i].values, params[i].values + params[i].count, std::nanf(""));
        }
      };
      options.on_instruction_done = [&](size_t) {
        for (size_t i = 0; i < params.size(); ++i) {
          if (saved[i].empty()) continue;
          std::copy(saved[i].begin(), saved[i].end(), params[i].values);
          saved[i].clear();
        }
      };
    }
    LoopbackDirectory comms(world, placement, rank, run);
    execute_program(p.plan, program, *model, comms, std::move(options));
    std::vector<std::vector<float>>& mine = out[static_cast<size_t>(rank)];
    mine.push_back(model->micro_batch_losses());
    for (const ParameterView& v : params) mine.emplace_back(v.gradient, v.gradient + v.count);
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// The overlapped parameter gather lets an instruction run once the buckets of its read key
// are gathered: hiding every other parameter behind NaN must change no bit.
TEST_P(GradientWritersMatchTheModel, InstructionsReadOnlyTheParametersOfTheirKey) {
  const PlannedJob p = GetParam() == "shared-expert" ? shared_expert_job() : shipped(GetParam());
  const auto clean = outputs(p, false, "clean/");
  const auto poisoned = outputs(p, true, "poisoned/");
  ASSERT_EQ(clean.size(), poisoned.size());
  for (size_t r = 0; r < clean.size(); ++r) {
    ASSERT_EQ(clean[r].size(), poisoned[r].size());
    for (size_t i = 0; i < clean[r].size(); ++i) {
      const bool same =
          std::equal(clean[r][i].begin(), clean[r][i].end(), poisoned[r][i].begin(),
                     [](float a, float b) { return std::isnan(a) ? std::isnan(b) : a == b; });
      EXPECT_TRUE(same) << "rank " << r << ", output " << i << " (0: losses, then gradients)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, GradientWritersMatchTheModel,
                         ::testing::Values("tiny-tp2-pp2", "tiny-cp2-tp2", "tiny-tp2-recompute",
                                           "tiny-moe-ep2-tp2", "tiny-moe-ep2-pp2", "shared-expert"),
                         [](const auto& plan) { return test_name(plan.param); });

// Every rank's gradients after one co-executed iteration, summed either by the reference
// (per parameter, after the iteration) or by the overlapped reducer in buckets of
// `bucket_elements`.
std::vector<std::vector<std::vector<float>>> summed_gradients(const PlannedJob& p, bool overlapped,
                                                              int64_t bucket_elements,
                                                              int64_t& buckets_seen) {
  const Placement placement(p.job.parallel, p.job.cluster.gpus_per_node);
  LoopbackWorld world(placement.world_size());
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(placement.world_size()));
  std::vector<int64_t> buckets(out.size(), 0);
  const std::string run = overlapped ? "overlapped/" : "reference/";
  const auto errors = on_every_rank(placement.world_size(), [&](int64_t rank) {
    const RankProgram program = lower_rank_program(p.plan, p.job, rank, ExecutionMode::kCoExecuted);
    std::unique_ptr<StageModel> model = make_model(p, placement, rank, program.stage);
    const std::vector<ParameterView> params = model->parameters();
    auto group = [&](const std::string& key, const std::vector<int64_t>& members,
                     const char* name) {
      return world.communicator(run + key + std::to_string(members.front()), members, rank, name);
    };
    const auto tp = group("tp/", placement.group(ParallelDim::kTp, rank).ranks, "tp");
    const auto dense = group("dense/", dp_cp_members(placement, rank), "dp");
    const auto expert =
        group("expert/", ProcessGroups::expert_data_parallel_ranks(placement, rank), "expert-dp");
    LoopbackDirectory comms(world, placement, rank, run);
    if (overlapped) {
      GradientReducer reducer(
          params, reduction_buckets_of(params, &program, bucket_elements, p.job.parallel.ep > 1),
          {.tp = tp.get(), .dense = dense.get(), .expert = expert.get()});
      ExecutionOptions options{.jitter_us = 100, .jitter_seed = 3, .on_failure = {}};
      options.on_instruction_done = reducer.start(program, true, {});
      execute_program(p.plan, program, *model, comms, std::move(options));
      reducer.finish();
      buckets[static_cast<size_t>(rank)] = static_cast<int64_t>(reducer.buckets().size());
    } else {
      execute_program(p.plan, program, *model, comms, {});
      synchronise_gradients(params, *tp, *dense, expert.get());
    }
    for (const ParameterView& v : params) {
      out[static_cast<size_t>(rank)].emplace_back(v.gradient, v.gradient + v.count);
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  buckets_seen = *std::min_element(buckets.begin(), buckets.end());
  return out;
}

class OverlappedReduction : public ::testing::TestWithParam<std::string> {};

TEST_P(OverlappedReduction, EqualsThePerParameterSumsBitwise) {
  const PlannedJob p = shipped(GetParam());
  int64_t buckets = 0;
  const auto reference = summed_gradients(p, false, 1, buckets);
  // 4096 elements: several buckets on these tiny models, some of several parameters.
  const auto overlapped = summed_gradients(p, true, 4096, buckets);
  EXPECT_GE(buckets, 3);
  ASSERT_EQ(reference.size(), overlapped.size());
  for (size_t r = 0; r < reference.size(); ++r) {
    ASSERT_EQ(reference[r].size(), overlapped[r].size());
    for (size_t i = 0; i < reference[r].size(); ++i) {
      EXPECT_EQ(reference[r][i], overlapped[r][i]) << "rank " << r << ", parameter " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, OverlappedReduction,
                         ::testing::Values("tiny-dp2-tp2", "tiny-moe-ep2", "tiny-cp2-tp2"),
                         [](const auto& plan) { return test_name(plan.param); });

}  // namespace
}  // namespace dhelix::rt
