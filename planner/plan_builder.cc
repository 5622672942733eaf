#include "planner/plan_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>

#include "lib/cluster_reader.h"
#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "lib/error.h"
#include "lib/int_math.h"
#include "lib/job_reader.h"
#include "lib/model_reader.h"
#include "lib/placement.h"
#include "lib/profile_bounds.h"
#include "lib/provenance.h"
#include "lib/stage_split.h"
#include "planner/baseline_schedules.h"
#include "planner/chosen_split.h"
#include "planner/dhelix_shapes.h"
#include "planner/dp_overlap.h"
#include "planner/folding.h"
#include "planner/iteration_metrics.h"
#include "planner/layer_costs.h"
#include "planner/pipeline_schedule.h"
#include "planner/pipeline_simulator.h"
#include "planner/plan_context.h"
#include "planner/plan_stage_records.h"
#include "planner/profile_co_run.h"
#include "planner/scheme_memory.h"
#include "planner/scheme_timeline.h"
#include "planner/virtual_pipeline.h"

namespace dhelix {
namespace {

using namespace plan_detail;

constexpr double kAdamBytesPerParameter = 30;

// ----- activation recompute ---------------------------------------------------------------

// The DAG variant of the layers that recompute: the job's granularity.
RecomputeGranularity recomputed_layers(const JobSpec& job) {
  return job.parallel.recompute.granularity;
}

bool block_recompute(const JobSpec& job) {
  return job.parallel.recompute.granularity == RecomputeGranularity::kFull &&
         job.parallel.recompute.method == RecomputeMethod::kBlock;
}

// Every op whose solo time the plan needs, for the profile check.
std::vector<Op> needed_ops(const JobSpec& job, const std::vector<int64_t>& ranks) {
  std::vector<Op> ops;
  const auto add = [&ops](const LayerDags& dags) {
    for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
      for (int64_t i = 0; i < dag->size(); ++i) ops.push_back(dag->op(i));
    }
  };
  for (int64_t rank : ranks) {
    add(build_layer_dags(job, rank));
    add(build_stage_extras(job, rank, true, true));
    add(build_intra_batch_layer_dags(job, rank));
  }
  return ops;
}

// The signatures of a stage's layer DAGs: stages with equal keys share one analysis.
std::string shape_key(const LayerDags& dags) {
  std::string key;
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) key += dag->op(i).signature() + "|";
    key += "#";
  }
  return key;
}

// Steps build_plan reports to PlanRequest::progress.
class PlanProgress {
 public:
  PlanProgress(const PlanRequest& request, int64_t stages, int64_t schemes)
      : report_(request.progress), total_(stages + schemes + 1) {
    step(0);
  }
  void step(int64_t n = 1) {
    done_ += n;
    if (report_) report_(done_, total_);
  }

 private:
  const std::function<void(int64_t, int64_t)>& report_;
  int64_t total_;
  int64_t done_ = 0;
};

void analyze_stages(Context& ctx, PlanProgress& progress) {
  std::map<std::string, int64_t> index_of_key;
  for (int64_t rank : ctx.shape_ranks) {
    const std::string key = shape_key(build_layer_dags(*ctx.job, rank));
    auto [it, inserted] = index_of_key.emplace(key, static_cast<int64_t>(ctx.analyses.size()));
    if (inserted) {
      ctx.analyses.push_back(std::make_unique<LayerAnalysis>(
          analyze_layers(*ctx.job, rank, *ctx.profile, *ctx.co_run, ctx.folded.layers_per_chunk,
                         ctx.request->cross_layer_max_segment_ops, recomputed_layers(*ctx.job),
                         ctx.request->pairing_memo)));
      if (block_recompute(*ctx.job)) {
        ctx.plain_analyses.push_back(std::make_unique<LayerAnalysis>(
            analyze_layers(*ctx.job, rank, *ctx.profile, *ctx.co_run, ctx.folded.layers_per_chunk,
                           ctx.request->cross_layer_max_segment_ops, RecomputeGranularity::kNone,
                           ctx.request->pairing_memo)));
      }
    }
    ctx.analysis_of_stage.push_back(it->second);
    progress.step();
  }
}

// ----- assembling the plan --------------------------------------------------------------

void fill_job(const JobSpec& job, Plan& plan) {
  const OrderedJson model = model_to_json(job.model);
  const OrderedJson cluster = cluster_to_json(job.cluster);
  const OrderedJson parallel = parallel_to_json(job.parallel);
  plan.inputs.model = {.name = job.model.name, .sha256 = sha256_hex(model.dump())};
  plan.inputs.parallel = parallel;
  plan.inputs.cluster = {.name = job.cluster.name, .sha256 = sha256_hex(cluster.dump())};
  plan.job = {.name = job.name, .model = model, .cluster = cluster, .parallel = parallel};
}

Context make_context(const PlanRequest& request) {
  const JobSpec& job = *request.job;
  Context ctx{
      .request = &request,
      .job = &job,
      .profile = request.profile,
      .co_run = std::make_unique<PairTimesCoRunModel>(profile_co_run_model(*request.profile)),
      .placement = Placement(job.parallel, job.cluster.gpus_per_node),
      .folded = fold_job_layers(job.model.num_layers, job.parallel),
      .unfolded = unfold_job_layers(job.model.num_layers, job.parallel),
      .pp = job.parallel.pp,
      .micro_batches = job.parallel.num_micro_batches(),
      .shape_ranks = {},
      .analyses = {},
      .analysis_of_stage = {},
      .plain_analyses = {}};
  for (int64_t stage = 0; stage < ctx.pp; ++stage) {
    ctx.shape_ranks.push_back(ctx.placement.rank_of({.pp = stage}));
  }
  ctx.virtual_pipeline =
      virtual_pipeline_size(job, ctx.micro_batches, request.virtual_pipeline_size);
  if (ctx.virtual_pipeline > 1) {
    std::string why;
    ctx.interleaved_layers =
        *interleaved_stage_layers(job.model.num_layers, job.parallel, ctx.virtual_pipeline, why);
  }
  return ctx;
}

}  // namespace

double optimizer_step_us(const GpuSpec& gpu, int64_t shard_parameters) {
  const double bytes_per_us = gpu.memory_bandwidth_gbps * gpu.memory_efficiency * 1e3;
  return bytes_per_us <= 0
             ? 0
             : static_cast<double>(shard_parameters) * kAdamBytesPerParameter / bytes_per_us;
}

PlanResult build_plan(const PlanRequest& given) {
  DHELIX_CHECK(given.job != nullptr && given.profile != nullptr);
  DHELIX_CHECK(static_cast<bool>(given.unprofiled_op_time_us));
  // 0. The planner's own uneven split where the layers do not fold and the job sets none
  // (planner/chosen_split.h): every step below, and the plan's job, use it.
  PlanResult result;
  std::string split_note;
  const JobSpec job = with_planned_split(
      *given.job, [&given](const Op& op) { return profile_solo_time_us(*given.profile, op); },
      &split_note);
  if (!split_note.empty()) result.warnings.push_back(split_note);
  PlanRequest request = given;
  request.job = &job;
  // Megatron-FSDP's no_shard keeps every optimizer state on every replica (DDP).
  request.memory.distributed_optimizer =
      request.memory.distributed_optimizer && job.parallel.shards_optimizer();
  // 1. Layouts and the ranks whose shapes stand for each stage (may refuse the job).
  Context ctx = make_context(request);
  // 2. The profile must hold every op the plan will look up, at times the hardware allows;
  // the GPU must have memory beyond the reserve (memory_budget refuses it otherwise).
  const std::vector<Op> ops = needed_ops(*request.job, ctx.shape_ranks);
  check_profile_covers(*request.profile, ops, request.profile_name);
  check_profile_bounds(*request.profile, ops, request.job->cluster, request.profile_name);
  if (!request.allow_oom) memory_budget(*request.job, request.memory);
  // 3. Layer-level searches per distinct stage shape.
  constexpr PipelineScheme kSchemes[] = {PipelineScheme::kDHelix,
                                         PipelineScheme::kWaveletPlus,
                                         PipelineScheme::kIntraBatch,
                                         PipelineScheme::kMegatron1F1B,
                                         PipelineScheme::kMegatronInterleaved,
                                         PipelineScheme::kZeroBubbleH1,
                                         PipelineScheme::kZeroBubbleV,
                                         PipelineScheme::kDualPipeV,
                                         PipelineScheme::kDualPipeVHandwritten,
                                         PipelineScheme::kMegatronA2aOverlap};
  PlanProgress progress(request, ctx.pp, std::size(kSchemes));
  analyze_stages(ctx, progress);
  // 4. Every scheme that applies through the pipeline simulator (scheme_applies); the dhelix
  // plan takes the W or the V (planner/dhelix_shapes.h).
  const ExtraCosts extras = extra_costs(ctx);
  const MemoryBudget budget = memory_budget(request.job->cluster.gpu, request.memory);
  std::vector<SchemeRun> runs;
  PlanShapeChoice shape_choice;
  for (PipelineScheme scheme : kSchemes) {
    if (!scheme_applies(ctx, scheme)) {
      progress.step();
      continue;
    }
    if (scheme == PipelineScheme::kDHelix) {
      DhelixChoice choice =
          choose_dhelix_shape(ctx, extras, budget, request.shape, request.split_backward);
      shape_choice = std::move(choice.record);
      runs.push_back(std::move(choice.run));
    } else {
      runs.push_back(run_scheme(ctx, scheme, extras));
    }
    progress.step();
  }
  // 5. Memory: the dhelix plan must fit.
  if (request.allow_oom) {
    try {
      memory_budget(*request.job, request.memory);  // a GPU below the reserve, said clearly
      check_fits(runs.front().memory, budget, PipelineScheme::kDHelix);
    } catch (const Error& error) {
      result.warnings.push_back(std::string(error.what()) +
                                "\n(--allow-oom: the plan is written anyway)");
    }
  } else {
    check_fits(runs.front().memory, budget, PipelineScheme::kDHelix);
  }
  if (ctx.micro_batches <= ctx.pp) {
    result.warnings.push_back(fmt::format(
        "{} micro-batches on {} stages: the W pairs micro-batch j with j-{}, so there are no "
        "SI blocks and strand interleaving gains nothing",
        ctx.micro_batches, ctx.pp, ctx.pp));
  }
  // 6. The plan: inputs, pairings, stages with tasks, scheme figures.
  Plan& plan = result.plan;
  plan.meta = request.meta;
  fill_job(*request.job, plan);
  plan.inputs.profile = request.profile_ref;
  plan.options = {.allow_oom = request.allow_oom,
                  .distributed_optimizer = request.memory.distributed_optimizer,
                  .cross_layer_max_segment_ops = request.cross_layer_max_segment_ops,
                  .fsdp = std::nullopt};
  if (job.parallel.use_megatron_fsdp) {
    plan.options.fsdp =
        PlanFsdpRecord{.sharding_strategy = job.parallel.fsdp_sharding,
                       .reshard_after_forward = job.parallel.fsdp_reshard_after_forward};
  }
  plan.schema_version =
      plan_schema_version(plan.options, shape_choice.chosen == PipelineShape::kInterleaved);
  plan.num_micro_batches = ctx.micro_batches;
  plan.shape_choice = std::move(shape_choice);
  for (const auto& analysis : ctx.analyses) plan.pairings.push_back(pairing_record(*analysis));
  plan.stages = stage_records({.schedule = runs.front().schedule,
                               .simulation = runs.front().simulation,
                               .phases = runs.front().phases,
                               .placement = ctx.placement,
                               .folded = ctx.folded,
                               .unfolded = ctx.unfolded,
                               .shape_ranks = ctx.shape_ranks,
                               .pairing_of_stage = ctx.analysis_of_stage,
                               .model_chunk_layers = &ctx.interleaved_layers});
  plan.memory_budget = {.gpu = budget.gpu_name,
                        .capacity_bytes = budget.capacity_bytes,
                        .reserve_bytes = budget.reserve_bytes,
                        .usable_bytes = budget.usable_bytes()};
  const double megatron_us = runs[3].simulation.iteration_us;  // megatron-1f1b
  for (const SchemeRun& run : runs) {
    plan.schemes.push_back(scheme_record(ctx, run, budget, megatron_us));
    if (request.keep_timelines) {
      result.timelines.push_back(scheme_timeline(run.scheme, run.schedule, run.simulation));
    }
  }
  progress.step();
  return result;
}

}  // namespace dhelix
