// The schemes' runs for plan_builder.cc (planner/plan_context.h): costs outside the
// layers (embedding, head and loss, pipeline transfers, DP reduction), each scheme's stage
// costs from the layer analyses, its schedule through the simulator, and its record.

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/fsdp_sizes.h"
#include "planner/baseline_schedules.h"
#include "planner/combined_1f1b.h"
#include "planner/dp_overlap.h"
#include "planner/iteration_metrics.h"
#include "planner/plan_context.h"
#include "planner/scheme_memory.h"
#include "planner/scheme_timeline.h"

namespace dhelix::plan_detail {
namespace {

// ----- activation recompute ---------------------------------------------------------------

// `a` weighted by `share` and `b` by 1 - share, per layer (block recompute's chunk mix).
LayerCosts mix(const LayerCosts& a, const LayerCosts& b, double share) {
  LayerCosts out;
  const double rest = 1.0 - share;
  out.forward_us = share * a.forward_us + rest * b.forward_us;
  out.backward_us = share * a.backward_us + rest * b.backward_us;
  out.si_pair_us = share * a.si_pair_us + rest * b.si_pair_us;
  out.backward_weight_us = share * a.backward_weight_us + rest * b.backward_weight_us;
  out.forward_comm = a.forward_comm.scaled(share);
  out.forward_comm += b.forward_comm.scaled(rest);
  out.backward_comm = a.backward_comm.scaled(share);
  out.backward_comm += b.backward_comm.scaled(rest);
  out.si_pair_comm = a.si_pair_comm.scaled(share);
  out.si_pair_comm += b.si_pair_comm.scaled(rest);
  return out;
}

// ----- costs outside the layers ---------------------------------------------------------

Op comm_op(std::string id, OpKind kind, ParallelDim dim, int64_t group_size, int64_t bytes,
           const ProcessGroup& group) {
  Op op;
  op.id = std::move(id);
  op.kind = kind;
  op.group = dim;
  op.group_size = group_size;
  op.comm_bytes = bytes;
  op.scope = group.scope;
  op.nodes_spanned = group.nodes_spanned;
  op.stream = group.scope == GroupScope::kLocal ? StreamClass::kLocalComm : StreamClass::kCrossComm;
  return op;
}

// One activation (or its gradient) sent to the neighbour stage: the rank's tokens of the
// hidden state, split over tp with sequence parallelism.
void set_p2p(const Context& ctx, int64_t stage, StageCosts& costs) {
  if (ctx.pp == 1) return;
  const ParallelSpec& par = ctx.job->parallel;
  const int64_t elements =
      par.tokens_per_rank() * ctx.job->model.hidden_size / (par.sp ? par.tp : 1);
  costs.p2p_bytes = elements * dtype_bytes(ctx.job->model.dtype);
  const ProcessGroup group =
      ctx.placement.group(ParallelDim::kPp, ctx.shape_ranks[static_cast<size_t>(stage)]);
  const Op op =
      comm_op("pp.send_recv", OpKind::kSendRecv, ParallelDim::kPp, 2, costs.p2p_bytes, group);
  costs.p2p_us = ctx.request->unprofiled_op_time_us(op);
}

// Gradient reduction over the data-parallel replicas (dp·cp ranks hold the same weights):
// reduce-scatter of fp32 gradients and all-gather of bf16 weights with the distributed
// optimizer, one fp32 all-reduce without. Experts reduce over Megatron-Core's
// expert-data-parallel group, dp·cp·tp / (ep·etp) ranks (with etp = 1 beside tp > 1 every TP
// rank holds whole experts, so the group spans the TP ranks too). Solo times; dp_overlap.h
// decides what of it the iteration sees.
struct DpTimes {
  double reduce_us = 0;  ///< reduce-scatter (or all-reduce) of the gradients
  double gather_us = 0;  ///< all-gather of the parameters (distributed optimizer only)
  int64_t buckets = 1;   ///< Megatron's DDP buckets over the stage's parameters
};

DpTimes dp_times(const Context& ctx, int64_t stage, const StageParameters& params) {
  const ParallelSpec& par = ctx.job->parallel;
  const int64_t rank = ctx.shape_ranks[static_cast<size_t>(stage)];
  const ProcessGroup dense_group =
      ctx.placement.group(par.dp > 1 ? ParallelDim::kDp : ParallelDim::kCp, rank);
  DpTimes out;
  // The gradients travel in the main buffer's type: fp32, or bf16 with --grad-reduce-in-bf16.
  const int64_t grad_bytes = gradient_bytes_per_parameter(par);
  const auto reduce = [&](int64_t parameters, int64_t group_size, const ProcessGroup& group,
                          const char* what) {
    if (parameters == 0 || group_size <= 1) return;
    if (ctx.request->memory.distributed_optimizer) {
      out.reduce_us += ctx.request->unprofiled_op_time_us(
          comm_op(fmt::format("dp.{}_reduce_scatter", what), OpKind::kReduceScatter,
                  ParallelDim::kDp, group_size, grad_bytes * parameters, group));
      out.gather_us += ctx.request->unprofiled_op_time_us(
          comm_op(fmt::format("dp.{}_all_gather", what), OpKind::kAllGather, ParallelDim::kDp,
                  group_size, 2 * parameters, group));
    } else {
      out.reduce_us += ctx.request->unprofiled_op_time_us(
          comm_op(fmt::format("dp.{}_all_reduce", what), OpKind::kAllReduce, ParallelDim::kDp,
                  group_size, grad_bytes * parameters, group));
    }
  };
  // Under FSDP's optim_grads_params the layers reduce-scatter their gradients and gather
  // their parameters themselves (lib/dag_builder_fsdp.cc): only the stage extras are left.
  // A mixture of experts' experts likewise, over the expert-data-parallel group.
  const int64_t dense = params.dense - params.fsdp_layers;
  reduce(dense, par.dp * par.cp, dense_group, "dense");
  reduce(params.expert - params.fsdp_experts, fsdp_expert_data_parallel_size(par),
         fsdp_expert_group(ctx.placement, par, rank), "expert");
  out.buckets = megatron_dp_buckets(params.total() - params.fsdp_layers - params.fsdp_experts,
                                    par.dp * par.cp);
  return out;
}

// The stage's DP time after Megatron's overlap: under one micro-batch's backward (the last)
// and forward (the next iteration's first) of every chunk the stage holds.
DpOverlap set_dp_time(const Context& ctx, const DpTimes& dp, double chunk_count,
                      StageCosts& costs) {
  const ParallelSpec& par = ctx.job->parallel;
  const DpOverlap overlap = overlap_dp(
      dp.reduce_us, dp.gather_us, dp.buckets, costs.backward_chunk_us * chunk_count,
      costs.forward_chunk_us * chunk_count, par.overlap_grad_reduce, par.overlap_param_gather);
  costs.dp_reduce_us = overlap.exposed_us;
  costs.dp_hidden_us = overlap.hidden_us;
  return overlap;
}

// What the plan records of a stage's time beside and after its tasks (PlanStagePhases).
PlanStagePhases stage_phases(const Context& ctx, int64_t stage, const DpTimes& dp,
                             const DpOverlap& overlap, const StageCosts& costs) {
  const ParallelSpec& par = ctx.job->parallel;
  const int64_t rank = ctx.shape_ranks[static_cast<size_t>(stage)];
  const auto stream = [&](ParallelDim dim) {
    return ctx.placement.group(dim, rank).scope == GroupScope::kLocal ? StreamClass::kLocalComm
                                                                      : StreamClass::kCrossComm;
  };
  return {.p2p_us = costs.p2p_us,
          .p2p_stream = stream(ParallelDim::kPp),
          .dp_reduce_hidden_us = dp.reduce_us - overlap.reduce_exposed_us,
          .dp_reduce_exposed_us = overlap.reduce_exposed_us,
          .dp_gather_hidden_us = dp.gather_us - overlap.gather_exposed_us,
          .dp_gather_exposed_us = overlap.gather_exposed_us,
          .dp_stream = stream(par.dp > 1 ? ParallelDim::kDp : ParallelDim::kCp),
          .optimizer_us = costs.optimizer_us};
}

// ----- the schemes ----------------------------------------------------------------------

// DualPipeV's overlapped forward-backward pairs cost what DHelix's search gives an SI block.
bool uses_pairing_search(PipelineScheme scheme) {
  return scheme == PipelineScheme::kDHelix || scheme == PipelineScheme::kDualPipeV;
}

const LayerCosts& scheme_layer(const LayerAnalysis& a, PipelineScheme scheme) {
  switch (scheme) {
    case PipelineScheme::kMegatron1F1B:
    case PipelineScheme::kMegatronInterleaved:
    case PipelineScheme::kZeroBubbleH1:
    case PipelineScheme::kZeroBubbleV:
      return a.megatron;
    case PipelineScheme::kDualPipeV:
      return a.dhelix_layer;
    case PipelineScheme::kDualPipeVHandwritten:
      return a.deepseek_layer;
    case PipelineScheme::kMegatronA2aOverlap:
      return a.megatron_a2a_layer;
    case PipelineScheme::kIntraBatch:
      return a.intra_batch;
    case PipelineScheme::kWaveletPlus:
      return a.wavelet_layer;
    case PipelineScheme::kDHelix:
      return a.dhelix_layer;
  }
  return a.megatron;
}

// Layers of a stage's first chunk (down for the W and the V, whole for 1F1B, one model
// chunk for interleaved 1F1B) and of its up chunk.
std::pair<int64_t, int64_t> stage_chunk_layers(const Context& ctx, PipelineShape shape,
                                               int64_t stage) {
  const size_t s = static_cast<size_t>(stage);
  if (shape == PipelineShape::kOneFOneB) return {ctx.unfolded.stages[s].count, 0};
  if (shape == PipelineShape::kInterleaved) {
    if (ctx.interleaved_layers.empty()) return {ctx.unfolded.stages[s].count, 0};
    const std::vector<int64_t>& chunks = ctx.interleaved_layers[s];
    return {*std::max_element(chunks.begin(), chunks.end()), 0};  // the others scale from it
  }
  return {ctx.folded.stages[s].down.count, ctx.folded.stages[s].up.count};
}

// The chunk fields of `costs` for a first chunk of `layers` layers and an up chunk of
// `up_layers`: times from the layer analysis (block recompute mixes the recomputed and
// plain layers), bytes from the memory model.
StageCosts layer_chunk_costs(const Context& ctx, PipelineScheme scheme, int64_t stage,
                             int64_t layers, int64_t up_layers, const StageCosts& base) {
  const size_t index = static_cast<size_t>(ctx.analysis_of_stage[static_cast<size_t>(stage)]);
  const LayerAnalysis& a = *ctx.analyses[index];
  const ModelSpec& model = ctx.job->model;
  const ParallelSpec& par = ctx.job->parallel;
  LayerCosts layer = scheme_layer(a, scheme);
  double chunk_si_us = a.chunk_si_block_us;
  CommBreakdown chunk_si_comm = a.chunk_si_block_comm;
  if (!ctx.plain_analyses.empty()) {
    const LayerAnalysis& plain = *ctx.plain_analyses[index];
    const double share = static_cast<double>(std::min(par.recompute.num_layers, layers)) /
                         static_cast<double>(layers);
    layer = mix(layer, scheme_layer(plain, scheme), share);
    chunk_si_us = share * a.chunk_si_block_us + (1 - share) * plain.chunk_si_block_us;
    chunk_si_comm = a.chunk_si_block_comm.scaled(share);
    chunk_si_comm += plain.chunk_si_block_comm.scaled(1 - share);
  }
  StageCosts costs = chunk_costs(layer, layers, base);
  set_chunk_memory(model, par, layers, up_layers, ctx.request->memory, costs);
  if (uses_pairing_search(scheme)) {
    // The search's SI block is for chunks of a.chunk_layers layers; another size scales it.
    const bool same = layers == a.chunk_layers;
    const double scale = static_cast<double>(layers) / static_cast<double>(a.chunk_layers);
    costs.si_block_us = same ? chunk_si_us : chunk_si_us * scale;
    costs.si_block_comm = same ? chunk_si_comm : chunk_si_comm.scaled(scale);
  }
  return costs;
}

bool any_all_to_all(const Context& ctx) {
  return std::any_of(ctx.analyses.begin(), ctx.analyses.end(),
                     [](const auto& a) { return a->has_all_to_all; });
}

PipelineSchedule scheme_schedule(const Context& ctx, PipelineScheme scheme,
                                 const std::vector<StageCosts>& costs) {
  switch (scheme) {
    case PipelineScheme::kMegatronInterleaved:
      return make_interleaved_schedule(ctx.pp, ctx.micro_batches, ctx.virtual_pipeline);
    case PipelineScheme::kZeroBubbleH1:
      return make_zb_h1_schedule(ctx.pp, ctx.micro_batches);
    case PipelineScheme::kZeroBubbleV:
      return make_zb_v_schedule(ctx.pp, ctx.micro_batches, greedy_stage_times(costs),
                                kZbVPlannerExtraChunks);
    case PipelineScheme::kDualPipeV:
    case PipelineScheme::kDualPipeVHandwritten:
      return make_dualpipev_schedule(ctx.pp, ctx.micro_batches);
    case PipelineScheme::kMegatronA2aOverlap: {
      // Without all-to-alls the flag changes nothing (Megatron refuses it with EP = 1).
      PipelineSchedule base =
          make_interleaved_schedule(ctx.pp, ctx.micro_batches, ctx.virtual_pipeline);
      return any_all_to_all(ctx) ? make_combined_1f1b_schedule(base) : base;
    }
    default:
      return make_schedule(scheme_shape(scheme), ctx.pp, ctx.micro_batches);
  }
}

}  // namespace

ExtraCosts extra_costs(const Context& ctx) {
  const int64_t rank = ctx.shape_ranks.front();
  const LayerDags embedding = build_stage_extras(*ctx.job, rank, true, false);
  const LayerDags head = build_stage_extras(*ctx.job, rank, false, true);
  const auto time = [&ctx](const LayerDag& dag) {
    return single_strand_time_us(dag, *ctx.profile, *ctx.co_run);
  };
  return {.embedding_forward_us = time(embedding.forward),
          .embedding_backward_us = time(embedding.backward),
          .head_forward_us = time(head.forward),
          .head_backward_us = time(head.backward)};
}

// Every stage's costs under `scheme`, and what the plan records of each (PlanStagePhases).
std::vector<StageCosts> stage_costs(const Context& ctx, PipelineScheme scheme,
                                    const ExtraCosts& extras,
                                    std::vector<PlanStagePhases>& phases) {
  return stage_costs(ctx, scheme, scheme_shape(scheme), extras, phases);
}

std::vector<StageCosts> stage_costs(const Context& ctx, PipelineScheme scheme, PipelineShape shape,
                                    const ExtraCosts& extras,
                                    std::vector<PlanStagePhases>& phases) {
  const ParallelSpec& par = ctx.job->parallel;
  std::vector<StageCosts> out;
  for (int64_t stage = 0; stage < ctx.pp; ++stage) {
    StageCosts base;
    base.embedding_forward_us = extras.embedding_forward_us;
    base.embedding_backward_us = extras.embedding_backward_us;
    base.head_loss_forward_us = extras.head_forward_us;
    base.head_loss_backward_us = extras.head_backward_us;
    set_p2p(ctx, stage, base);
    const StageParameters params = stage_parameters(ctx.job->model, par, shape, stage);
    const DpTimes dp = dp_times(ctx, stage, params);
    const std::vector<StageMemory> memory =
        stage_memory(ctx.job->model, par, shape, ctx.request->memory,
                     std::vector<int64_t>(static_cast<size_t>(ctx.pp), 0));
    base.optimizer_us =
        optimizer_step_us(ctx.job->cluster.gpu, memory[static_cast<size_t>(stage)].optimizer_bytes /
                                                    optimizer_bytes_per_parameter(par));
    base.head_loss_transient_bytes = head_loss_transient_bytes(ctx.job->model, par);
    const auto [layers, up_layers] = stage_chunk_layers(ctx, shape, stage);
    StageCosts costs = layer_chunk_costs(ctx, scheme, stage, layers, up_layers, base);
    if (shape == PipelineShape::kInterleaved && !ctx.interleaved_layers.empty()) {
      set_model_chunk_memory(ctx.job->model, par,
                             ctx.interleaved_layers[static_cast<size_t>(stage)],
                             ctx.request->memory, costs);
    }
    // The W's stage holds a down and an up chunk (their sizes differ on an uneven stage 0),
    // the interleaved stage v chunks.
    const double chunks =
        shape == PipelineShape::kInterleaved
            ? static_cast<double>(ctx.virtual_pipeline)
            : static_cast<double>(layers + up_layers) / static_cast<double>(layers);
    const DpOverlap overlap = set_dp_time(ctx, dp, chunks, costs);
    phases.push_back(stage_phases(ctx, stage, dp, overlap, costs));
    // The hand-written pairs run node by node, the forward chunk's layers all in flight.
    costs.si_block_holds_whole_forward = scheme == PipelineScheme::kDualPipeV ||
                                         scheme == PipelineScheme::kDualPipeVHandwritten ||
                                         scheme == PipelineScheme::kMegatronA2aOverlap;
    out.push_back(costs);
  }
  return out;
}

bool scheme_applies(const Context& ctx, PipelineScheme scheme) {
  switch (scheme) {
    case PipelineScheme::kDualPipeV:
    case PipelineScheme::kDualPipeVHandwritten:
      return dualpipev_applies(ctx.pp, ctx.micro_batches);
    case PipelineScheme::kMegatronA2aOverlap:
      return combined_1f1b_applies(ctx.pp, ctx.virtual_pipeline);
    default:
      return true;
  }
}

SchemeRun run_schedule(const Context& ctx, PipelineScheme scheme, PipelineSchedule schedule,
                       const std::vector<StageCosts>& costs,
                       const std::vector<PlanStagePhases>& phases) {
  SchemeRun run;
  run.scheme = scheme;
  run.phases = phases;
  run.schedule = std::move(schedule);
  run.simulation = simulate_pipeline(run.schedule, costs);
  std::vector<int64_t> peaks;
  for (const StageSimulation& s : run.simulation.stages) peaks.push_back(s.peak_activation_bytes);
  run.memory = stage_memory(ctx.job->model, ctx.job->parallel, run.schedule.shape,
                            ctx.request->memory, peaks);
  return run;
}

SchemeRun run_scheme(const Context& ctx, PipelineScheme scheme, const ExtraCosts& extras) {
  std::vector<PlanStagePhases> phases;
  const std::vector<StageCosts> costs = stage_costs(ctx, scheme, extras, phases);
  return run_schedule(ctx, scheme, scheme_schedule(ctx, scheme, costs), costs, phases);
}

bool fits(const std::vector<StageMemory>& memory, const MemoryBudget& budget) {
  for (const StageMemory& m : memory) {
    if (m.total_bytes() > budget.usable_bytes()) return false;
  }
  return true;
}

PlanScheme scheme_record(const Context& ctx, const SchemeRun& run, const MemoryBudget& budget,
                         double megatron_us) {
  const PipelineSimulation& sim = run.simulation;
  const IterationMetrics metrics =
      iteration_metrics(ctx.job->model, ctx.job->parallel, ctx.job->cluster.gpu.peak_bf16_tflops,
                        sim.iteration_us, ctx.request->profile_name);
  PlanScheme s;
  s.scheme = run.scheme;
  s.shape = run.schedule.shape;
  s.chunks_per_stage = run.schedule.model_chunks * (folded_shape(run.schedule.shape) ? 2 : 1);
  s.iteration_us = sim.iteration_us;
  s.bubble_ratio = sim.bubble_ratio;
  s.tokens_per_second = metrics.tokens_per_second;
  s.tflops_per_gpu = metrics.tflops_per_gpu;
  s.mfu = metrics.mfu;
  s.speedup_vs_megatron = megatron_us / sim.iteration_us;
  const double per_gpu = 1.0 / static_cast<double>(ctx.pp);
  for (ParallelDim dim :
       {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp, ParallelDim::kDp, ParallelDim::kPp}) {
    s.comm.push_back({.type = dim,
                      .hidden_us = sim.comm[dim].hidden_us * per_gpu,
                      .exposed_us = sim.comm[dim].exposed_us * per_gpu});
  }
  s.p2p_transfers = sim.p2p_transfers;
  s.p2p_bytes = sim.p2p_bytes;
  s.fits = fits(run.memory, budget);
  for (const StageMemory& m : run.memory) {
    s.memory.push_back({.stage = m.stage,
                        .weight_bytes = m.weight_bytes,
                        .gradient_bytes = m.gradient_bytes,
                        .optimizer_bytes = m.optimizer_bytes,
                        .activation_bytes = m.activation_bytes,
                        .total_bytes = m.total_bytes()});
  }
  return s;
}

}  // namespace dhelix::plan_detail
