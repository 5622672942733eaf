#include "planner/config_search.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "emitter/search_report.h"
#include "lib/cluster_presets.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/plan/plan_writer.h"
#include "planner/chosen_split.h"
#include "planner/config_space.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "profiler/model_search.h"

namespace dhelix {
namespace {

std::string example(const std::string& relative) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/" + relative;
}

// A model of `layers` layers (llama-8b's shapes), on H100s, global batch `gbs` x `seq`.
JobSpec base_job(int64_t layers, int64_t gbs, int64_t seq) {
  JobSpec job;
  job.model = read_model_file(example("models/llama-8b.json"));
  job.model.num_layers = layers;
  job.cluster = find_cluster_preset("h100").value();
  job.parallel.global_batch_size = gbs;
  job.parallel.seq_length = seq;
  job.name = "search-test";
  return job;
}

SearchRequest model_request(const JobSpec& base, int64_t gpus, SearchConstraints constraints) {
  SearchRequest r;
  r.base = base;
  r.gpus = gpus;
  r.constraints = constraints;
  use_model_profiles(r);
  return r;
}

// The worked example of planner/config_space.h: 8 GPUs, 4 layers, gbs 16, recompute fixed.
TEST(ConfigSpace, WorkedExampleCountsNinetyFourConfigurations) {
  SearchConstraints c;
  c.search_recompute = false;
  c.cp_comm_type = CpCommType::kP2p;
  const std::vector<ParallelSpec> space = enumerate_configurations(base_job(4, 16, 4096), 8, c);
  EXPECT_EQ(space.size(), 94u);
  // Enumeration order: tp slowest, then sp, cp, pp, ..., micro-batch fastest.
  EXPECT_EQ(configuration_label(space.front(), false), "tp1 cp1 pp1 dp8 mbs1");
  EXPECT_EQ(configuration_label(space[1], false), "tp1 cp1 pp1 dp8 mbs2");
  EXPECT_EQ(configuration_label(space.back(), false), "tp8 sp cp1 pp1 dp1 mbs8");
  for (const ParallelSpec& p : space) {
    EXPECT_EQ(p.world_size(), 8);
    EXPECT_EQ(p.global_batch_size % (p.dp * p.micro_batch_size), 0);
    EXPECT_TRUE(p.tp > 1 || !p.sp);
  }
}

// The worked example's second table: the CP communication type searched where cp > 1.
TEST(ConfigSpace, CpCommTypeIsAnAxisWhereCpIsAboveOne) {
  SearchConstraints c;
  c.search_recompute = false;
  const std::vector<ParallelSpec> space = enumerate_configurations(base_job(4, 16, 4096), 8, c);
  EXPECT_EQ(space.size(), 216u);
  std::map<std::string, int> per_pair;
  for (const ParallelSpec& p : space) {
    if (p.cp == 1) {
      EXPECT_EQ(p.cp_comm_type, CpCommType::kP2p);
      continue;
    }
    EXPECT_EQ(validate_job([&] {
                JobSpec job = base_job(4, 16, 4096);
                job.parallel = p;
                return job;
              }())
                  .problems()
                  .size(),
              0u)
        << configuration_label(p, false);
    if (p.cp_comm_type == CpCommType::kA2aP2p) {
      // The sub-group stays inside a node beside TP.
      EXPECT_LE(p.hierarchical_cp_sizes[0] * p.tp, 8);
      EXPECT_EQ(p.hierarchical_cp_sizes[0] * p.hierarchical_cp_sizes[1], p.cp);
    }
    ++per_pair[fmt::format("tp{} cp{} {}", p.tp, p.cp, cp_comm_type_name(p.cp_comm_type))];
  }
  EXPECT_EQ(per_pair["tp1 cp2 a2a"], 7);
  EXPECT_EQ(per_pair["tp1 cp2 a2a+p2p"], 0);  // no sub-group A >= 2 below cp = 2
  EXPECT_EQ(per_pair["tp1 cp4 a2a+p2p"], 8);
  EXPECT_EQ(per_pair["tp2 cp4 allgather"], 8);
  EXPECT_EQ(per_pair["tp4 cp2 a2a"], 8);
  const auto labelled = std::find_if(space.begin(), space.end(), [](const ParallelSpec& p) {
    return p.cp_comm_type == CpCommType::kA2aP2p && p.tp == 1 && p.cp == 8;
  });
  ASSERT_NE(labelled, space.end());
  EXPECT_EQ(configuration_label(*labelled, false), "tp1 cp8(a2a+p2p 4x2) pp1 dp1 mbs1");
  // Fixed by --cp-comm-type: one type a configuration.
  c.cp_comm_type = CpCommType::kA2a;
  for (const ParallelSpec& p : enumerate_configurations(base_job(4, 16, 4096), 8, c))
    EXPECT_EQ(p.cp_comm_type, p.cp > 1 ? CpCommType::kA2a : CpCommType::kP2p);
}

TEST(ConfigSpace, FsdpStrategyIsAnAxisOnlyWhereAskedAndDpShards) {
  // The worked example's 94 configurations; the FSDP axis doubles those with dp > 1 and
  // cp = 1 (optim, optim_grads_params), keeps one (optim) where cp > 1 and one (FSDP off)
  // where dp = 1: tp·cp 1: 5·2 = 10; 2: (1,2) 7 + (2,1)·sp 2·7·2 = 35; 4: (1,4) 4 + 4,
  // (2,2)·sp 16, (4,1)·sp 2·(4·2 + 4) = 24: 48; 8: 28 at dp 1. 121 in all.
  SearchConstraints c;
  c.search_recompute = false;
  c.cp_comm_type = CpCommType::kP2p;
  const JobSpec base = base_job(4, 16, 4096);
  for (const ParallelSpec& p : enumerate_configurations(base, 8, c))
    EXPECT_FALSE(p.use_megatron_fsdp);  // not asked: no FSDP anywhere
  c.search_fsdp = true;
  const std::vector<ParallelSpec> space = enumerate_configurations(base, 8, c);
  EXPECT_EQ(space.size(), 121u);
  int64_t zero3 = 0;
  for (const ParallelSpec& p : space) {
    EXPECT_EQ(p.use_megatron_fsdp, p.dp > 1) << configuration_label(p, false);
    if (!p.fsdp_shards_parameters()) continue;
    ++zero3;
    EXPECT_EQ(p.cp, 1);
  }
  EXPECT_EQ(zero3, 121 - 94);
  // The base job's use_megatron_fsdp asks as the flag does.
  JobSpec fsdp_base = base;
  fsdp_base.parallel.use_megatron_fsdp = true;
  c.search_fsdp = false;
  EXPECT_EQ(enumerate_configurations(fsdp_base, 8, c).size(), 121u);
  // Fixed: one strategy wherever dp > 1 (validation judges cp > 1 later).
  c.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  const std::vector<ParallelSpec> fixed = enumerate_configurations(base, 8, c);
  EXPECT_EQ(fixed.size(), 94u);
  ParallelSpec labelled = fixed.front();
  EXPECT_NE(configuration_label(labelled, false).find(" fsdp-optim_grads_params"),
            std::string::npos)
      << configuration_label(labelled, false);
  labelled.fsdp_reshard_after_forward = false;
  EXPECT_NE(configuration_label(labelled, false).find(" fsdp-optim_grads_params(keep)"),
            std::string::npos);
  // Full recompute keeps optim_grads_params (its replay reads the backward's gathers): as
  // many ZeRO-3 configurations with each recompute setting.
  c.fsdp_sharding.reset();
  c.search_fsdp = true;
  c.search_recompute = true;
  std::map<RecomputeGranularity, int64_t> zero3_by_recompute;
  for (const ParallelSpec& p : enumerate_configurations(base, 8, c)) {
    if (p.fsdp_shards_parameters()) ++zero3_by_recompute[p.recompute.granularity];
  }
  EXPECT_EQ(zero3_by_recompute[RecomputeGranularity::kFull], 121 - 94);
  EXPECT_EQ(zero3_by_recompute[RecomputeGranularity::kNone], 121 - 94);
}

TEST(ConfigSpace, RecomputeTriplesTheSpace) {
  const std::vector<ParallelSpec> space = enumerate_configurations(base_job(4, 16, 4096), 8, {});
  EXPECT_EQ(space.size(), 3u * 216u);
}

TEST(ConfigSpace, ConstraintsFixAndBoundAxes) {
  SearchConstraints c;
  c.search_recompute = false;
  c.tp = 2;
  c.allow_cp = false;
  c.max_pp = 1;
  const std::vector<ParallelSpec> space = enumerate_configurations(base_job(4, 16, 4096), 8, c);
  // tp 2 with sp off and on, cp 1, pp 1, dp 4: micro-batches 1, 2, 4.
  ASSERT_EQ(space.size(), 6u);
  for (const ParallelSpec& p : space) {
    EXPECT_EQ(p.tp, 2);
    EXPECT_EQ(p.cp, 1);
    EXPECT_EQ(p.pp, 1);
  }
}

// 126 layers do not fold evenly on 16 stages: the enumeration keeps the depth (the search
// chooses its split per configuration, Search.ChoosesTheUnevenSplit).
TEST(ConfigSpace, UnevenStagesWhereEvenOnesDoNotExist) {
  SearchConstraints c;
  c.search_recompute = false;
  c.tp = 8;
  c.sp = true;
  c.allow_cp = false;
  c.pp = 16;
  c.micro_batch_size = 1;
  const std::vector<ParallelSpec> space =
      enumerate_configurations(base_job(126, 64, 8192), 1024, c);
  ASSERT_EQ(space.size(), 1u);
  EXPECT_EQ(space[0].first_stage_layers, 0);
  EXPECT_EQ(space[0].last_stage_layers, 0);
  EXPECT_EQ(configuration_label(space[0], false), "tp8 sp cp1 pp16 dp8 mbs1");
  c.pp = 64;  // 126 layers leave 64 stages no split: no configuration
  EXPECT_TRUE(enumerate_configurations(base_job(126, 64, 8192), 1024, c).empty());
}

// A depth whose layers do not fold gets the split dhelix-plan chooses for the same job
// (planner/chosen_split.h), with the same solo times; the label shows it.
TEST(ConfigSearch, ChoosesTheUnevenSplitOfNonFoldingDepths) {
  SearchConstraints c;
  c.search_recompute = false;
  c.tp = 2;
  c.sp = true;
  c.allow_cp = false;
  c.pp = 4;
  c.micro_batch_size = 1;
  const SearchRequest request = model_request(base_job(14, 8, 4096), 8, c);
  const SearchResult result = search_configurations(request);
  ASSERT_EQ(result.configs.size(), 1u);
  const ConfigOutcome& out = result.configs.front();
  const JobSpec job = configuration_job(request.base, out.parallel);
  const JobSpec expected = with_planned_split(
      configuration_job(request.base, enumerate_configurations(request.base, 8, c).front()),
      [&](const Op& op) { return request.solo_time_us(job.cluster, op); });
  EXPECT_GT(out.parallel.first_stage_layers, 0);
  EXPECT_EQ(out.parallel.first_stage_layers, expected.parallel.first_stage_layers);
  EXPECT_EQ(out.parallel.last_stage_layers, expected.parallel.last_stage_layers);
  EXPECT_NE(out.label.find(fmt::format("pp4({}/{})", out.parallel.first_stage_layers,
                                       out.parallel.last_stage_layers)),
            std::string::npos)
      << out.label;
  EXPECT_EQ(out.status, ConfigStatus::kPlanned) << out.reason;
}

TEST(ConfigSpace, RefusesNoGpus) {
  EXPECT_THROW(enumerate_configurations(base_job(4, 16, 4096), 0, {}), Error);
}

// A space small enough to plan every configuration: 16 GPUs, 8 layers, no CP.
SearchRequest small_request(int64_t threads) {
  SearchConstraints c;
  c.allow_cp = false;
  c.max_micro_batch_size = 2;
  c.search_recompute = false;
  SearchRequest r = model_request(base_job(8, 32, 4096), 16, c);
  r.top_k = 2;
  r.batch = 4;  // small batches, so that the bound has planned times to prune against
  r.threads = threads;
  return r;
}

TEST(ConfigSearch, PrunedSearchFindsWhatPlanningEverythingFinds) {
  SearchRequest pruned = small_request(2);
  SearchRequest exhaustive = small_request(1);
  exhaustive.prune = false;
  const SearchResult a = search_configurations(pruned);
  const SearchResult b = search_configurations(exhaustive);
  EXPECT_EQ(b.counts.pruned, 0);
  EXPECT_GT(a.counts.pruned, 0) << "the bound should prune something in this space";
  EXPECT_EQ(a.dhelix_ranking, b.dhelix_ranking);
  EXPECT_EQ(a.megatron_ranking, b.megatron_ranking);
  for (int64_t i : a.dhelix_ranking) {
    EXPECT_EQ(a.configs[i].dhelix.iteration_us, b.configs[i].dhelix.iteration_us);
  }
  for (int64_t i : a.megatron_ranking) {
    EXPECT_EQ(a.configs[i].megatron.iteration_us, b.configs[i].megatron.iteration_us);
  }
  // Every bound is below what planning found (it is a lower bound of both schemes).
  for (const ConfigOutcome& c : b.configs) {
    if (c.status != ConfigStatus::kPlanned) continue;
    EXPECT_LE(c.bounds.dhelix_us, c.dhelix.iteration_us) << c.label;
    EXPECT_LE(c.bounds.megatron_us, c.megatron.iteration_us) << c.label;
    EXPECT_GT(c.bounds.megatron_us, 0.5 * c.megatron.iteration_us) << c.label << ": loose";
  }
}

TEST(ConfigSearch, SameBytesForAnyThreadCount) {
  const SearchReportContext context{.model = "m",
                                    .cluster = "h100",
                                    .gpus = 16,
                                    .global_batch_size = 32,
                                    .seq_length = 4096,
                                    .top_k = 3};
  const std::string one = search_report_json(search_configurations(small_request(1)), context);
  const std::string three = search_report_json(search_configurations(small_request(3)), context);
  EXPECT_EQ(one, three);
}

// The best configuration is one the planner plans, with the figures the search reported.
TEST(ConfigSearch, BestConfigurationPlansWithTheReportedFigures) {
  const SearchRequest request = small_request(2);
  const SearchResult result = search_configurations(request);
  const ConfigOutcome* best = result.best_dhelix();
  ASSERT_NE(best, nullptr);
  const JobSpec job = configuration_job(request.base, best->parallel);
  const Profile profile = request.make_profile(job);
  PlanRequest plan_request;
  plan_request.job = &job;
  plan_request.profile = &profile;
  plan_request.unprofiled_op_time_us = [&job](const Op& op) { return op_time_us(job.cluster, op); };
  const Plan plan = build_plan(plan_request).plan;
  EXPECT_EQ(plan.find_scheme(PipelineScheme::kDHelix)->iteration_us, best->dhelix.iteration_us);
}

// A configuration rejected for its activations before planning is one whose plans would
// not fit under either scheme, with the peaks the report gives.
TEST(ConfigSearch, ActivationMemoryRejectionsAreThePlansVerdict) {
  SearchConstraints constraints;
  constraints.allow_cp = false;
  constraints.search_recompute = false;
  const SearchRequest request = model_request(base_job(4, 64, 32768), 8, constraints);
  const SearchResult result = search_configurations(request);
  int64_t rejected = 0;
  for (const ConfigOutcome& c : result.configs) {
    if (c.status != ConfigStatus::kNoMemory || c.dhelix.peak_memory_bytes == 0) continue;
    ++rejected;
    const JobSpec job = configuration_job(request.base, c.parallel);
    const Profile profile = request.make_profile(job);
    PlanRequest plan_request;
    plan_request.job = &job;
    plan_request.profile = &profile;
    plan_request.unprofiled_op_time_us = [&job](const Op& op) {
      return op_time_us(job.cluster, op);
    };
    plan_request.allow_oom = true;
    const Plan plan = build_plan(plan_request).plan;
    for (PipelineScheme scheme : {PipelineScheme::kDHelix, PipelineScheme::kMegatron1F1B}) {
      const PlanScheme& planned = *plan.find_scheme(scheme);
      EXPECT_FALSE(planned.fits) << c.label;
      int64_t peak = 0;
      for (const PlanStageMemory& stage : planned.memory) peak = std::max(peak, stage.total_bytes);
      const SearchSchemeFigures& reported =
          scheme == PipelineScheme::kDHelix ? c.dhelix : c.megatron;
      EXPECT_EQ(peak, reported.peak_memory_bytes) << c.label;
    }
  }
  EXPECT_GE(rejected, 3);
}

TEST(ConfigSearch, RefusesBadRequests) {
  SearchRequest r = small_request(1);
  r.threads = 0;
  EXPECT_THROW(search_configurations(r), Error);
  r = small_request(1);
  r.top_k = 0;
  EXPECT_THROW(search_configurations(r), Error);
}

// ----- issue 37: a search that says what happened -------------------------------------------

std::string search_error(const SearchRequest& request) {
  try {
    search_configurations(request);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    return e.what();
  }
  ADD_FAILURE() << "the search ran";
  return "";
}

// --gpus 7 with a global batch of 8: nothing is enumerated, which used to be reported as
// "none fits in memory". The error names the axis where every configuration stopped.
TEST(ConfigSearch, AnEmptySpaceSaysWhyNothingWasEnumerated) {
  EXPECT_EQ(search_error(model_request(base_job(4, 8, 4096), 7, {})),
            "--gpus: 7: no parallel configuration to search: 7 GPUs: every tp·cp·pp·dp = 7 has "
            "dp in {7}, and no dp·micro_batch_size (micro_batch_size in {1, 2, 4, 8}) divides "
            "global batch 8");
  SearchConstraints tp4;
  tp4.tp = 4;
  EXPECT_EQ(search_error(model_request(base_job(4, 8, 4096), 6, tp4)),
            "--gpus: 6: no parallel configuration to search: 6 GPUs: no tp·cp·pp·dp = 6: tp and "
            "cp are powers of two and pp is one of 1, 2 (the depths 4 layers split over), and no "
            "tp·cp·pp of them divides 6");
  SearchConstraints pp3;
  pp3.pp = 3;
  EXPECT_NE(search_error(model_request(base_job(4, 8, 4096), 6, pp3))
                .find("4 layers split over no pipeline depth allowed (--pp 3)"),
            std::string::npos);
  SearchConstraints dp3;
  dp3.dp = 3;
  EXPECT_NE(search_error(model_request(base_job(4, 8, 4096), 8, dp3))
                .find("8 GPUs: --dp 3 is not 8 / (tp·cp·pp) for any layout (dp could be 1, 2, "
                      "4, 8)"),
            std::string::npos);
  EXPECT_EQ(empty_space_reason(base_job(4, 16, 4096), 8, {}), "");
}

TEST(ConfigSearch, MoreGpusThanAFixedClusterHasIsRefused) {
  JobSpec base = base_job(4, 8, 4096);
  base.cluster.num_nodes = 1;
  EXPECT_EQ(search_error(model_request(base, 1000000, {})),
            "--gpus: 1000000 is more GPUs than cluster " + base.cluster.name +
                " has (1 node x 8 GPUs = 8)");
  base.cluster.num_nodes = 0;  // as many nodes as the job needs: no bound
  EXPECT_EQ(empty_space_reason(base, 8, {}), "");
}

// "none fits in memory" only when configurations were enumerated and refused on memory,
// with the count; a space whose every configuration breaks a rule says that instead.
TEST(ConfigSearch, NoBestSaysWhetherRulesOrMemoryRefusedEverything) {
  SearchConstraints tp16;
  tp16.tp = 16;  // llama-8b has 8 KV heads: every configuration breaks a rule
  tp16.search_recompute = false;
  const SearchResult invalid =
      search_configurations(model_request(base_job(4, 16, 4096), 16, tp16));
  ASSERT_GT(invalid.counts.enumerated, 0);
  EXPECT_EQ(no_best_reason(invalid, PipelineScheme::kDHelix),
            fmt::format("none: each of the {} configurations breaks a rule of the job (see the "
                        "most common rejections)",
                        invalid.counts.enumerated));
  JobSpec small_gpu = base_job(32, 16, 4096);
  small_gpu.cluster.gpu.memory_bytes = int64_t{3} << 30;
  SearchConstraints c;
  c.search_recompute = false;
  const SearchResult memory = search_configurations(model_request(small_gpu, 8, c));
  ASSERT_TRUE(memory.dhelix_ranking.empty());
  const int64_t refused = memory.counts.enumerated - memory.counts.invalid;
  ASSERT_GT(refused, 0);
  EXPECT_EQ(
      no_best_reason(memory, PipelineScheme::kDHelix)
          .rfind(fmt::format("none fits in memory: {} configurations refused on memory (", refused),
                 0),
      0u)
      << no_best_reason(memory, PipelineScheme::kDHelix);
  SearchReportContext context;
  context.gpus = 8;
  const std::string text = search_report_text(memory, context);
  EXPECT_NE(text.find("best dhelix:            none fits in memory: "), std::string::npos) << text;
}

// Plans that share layers through a memo are the bytes of plans made without one.
TEST(PairingMemo, PlansWithAndWithoutAMemoAreIdentical) {
  PairingMemo memo;
  for (int64_t pp : {1, 2}) {
    JobSpec job = base_job(8, 32, 4096);
    job.parallel.tp = 4;
    job.parallel.sp = true;
    job.parallel.pp = pp;
    job.parallel.dp = 4 / pp;
    job.parallel.micro_batch_size = 1;
    const Profile profile = make_model_profile(job, OrderedJson::object());
    PlanRequest request;
    request.job = &job;
    request.profile = &profile;
    request.unprofiled_op_time_us = [&job](const Op& op) { return op_time_us(job.cluster, op); };
    const std::string alone = plan_to_text(build_plan(request).plan);
    request.pairing_memo = &memo;
    EXPECT_EQ(plan_to_text(build_plan(request).plan), alone) << "pp " << pp;
  }
  EXPECT_GT(memo.hits(), 0) << "the second depth shares the first one's layer searches";
}

}  // namespace
}  // namespace dhelix
