#include "lib/plan/plan_writer.h"

#include <cmath>

#include "lib/atomic_file.h"

namespace dhelix {
namespace {

double round_to(double value, double scale) {
  const double rounded = std::round(value * scale) / scale;
  return rounded == 0 ? 0.0 : rounded;  // no "-0.0" in files
}

OrderedJson input_ref_json(const PlanInputRef& ref, const char* name_key) {
  return OrderedJson{{name_key, ref.name}, {"sha256", ref.sha256}};
}

OrderedJson op_json(const PlanOp& op) {
  return OrderedJson{{"id", op.id},
                     {"kind", op_kind_name(op.kind)},
                     {"stream", stream_class_name(op.stream)},
                     {"group", op.group ? parallel_dim_name(*op.group) : ""},
                     {"signature", op.signature},
                     {"solo_us", round_time_us(op.solo_us)}};
}

OrderedJson ops_json(const std::vector<PlanOp>& ops) {
  OrderedJson out = OrderedJson::array();
  for (const PlanOp& op : ops) out.push_back(op_json(op));
  return out;
}

OrderedJson block_json(const PlanBlock& block) {
  OrderedJson timings = OrderedJson::array();
  for (const PlanOpTiming& t : block.timings) {
    timings.push_back(OrderedJson{{"strand", pass_name(t.strand)},
                                  {"op", t.op},
                                  {"start_us", round_time_us(t.start_us)},
                                  {"finish_us", round_time_us(t.finish_us)}});
  }
  return OrderedJson{{"time_us", round_time_us(block.time_us)},
                     {"forward_ops", block.forward_ops},
                     {"backward_ops", block.backward_ops},
                     {"timings", timings}};
}

OrderedJson blocks_json(const std::vector<PlanBlock>& blocks) {
  OrderedJson out = OrderedJson::array();
  for (const PlanBlock& block : blocks) out.push_back(block_json(block));
  return out;
}

OrderedJson pairing_json(const PlanPairing& p) {
  OrderedJson out{{"forward_ops", ops_json(p.forward_ops)},
                  {"backward_ops", ops_json(p.backward_ops)},
                  {"scope", kPairingScopeNames.name(p.scope)},
                  {"chunk_layers", p.chunk_layers},
                  {"layer_scope_us", round_time_us(p.layer_scope_us)},
                  {"chunk_scope_us", round_time_us(p.chunk_scope_us)},
                  {"window_layers", p.window_layers},
                  {"sequential_us", round_time_us(p.sequential_us)},
                  {"layer_pair_us", round_time_us(p.layer_pair_us)},
                  {"layer_blocks", blocks_json(p.layer_blocks)},
                  {"window_blocks", blocks_json(p.window_blocks)},
                  {"remainder_blocks", blocks_json(p.remainder_blocks)}};
  if (p.layer_segment_bound > 0) out["layer_segment_bound"] = p.layer_segment_bound;
  if (p.window_segment_bound > 0) out["window_segment_bound"] = p.window_segment_bound;
  return out;
}

OrderedJson range_json(const PlanLayerRange& range) {
  return OrderedJson{{"first", range.first}, {"count", range.count}};
}

OrderedJson part_json(const std::optional<PlanTaskPart>& part) {
  if (!part) return nullptr;
  OrderedJson out{{"micro_batch", part->micro_batch},
                  {"chunk", chunk_side_name(part->chunk)},
                  {"layers", range_json(part->layers)}};
  // Written only when split, so that plans without split tasks keep their bytes.
  if (part->work != BackwardShare::kWhole) out["work"] = backward_share_name(part->work);
  if (part->model_chunk) out["model_chunk"] = *part->model_chunk;  // interleaved stages only
  return out;
}

OrderedJson task_json(const PlanTask& task) {
  OrderedJson waits = OrderedJson::array();
  for (const PlanTaskRef& ref : task.waits_for) {
    waits.push_back(OrderedJson{{"stage", ref.stage}, {"task", ref.task}});
  }
  return OrderedJson{{"index", task.index},
                     {"kind", task_kind_name(task.kind)},
                     {"label", task.label},
                     {"forward", part_json(task.forward)},
                     {"backward", part_json(task.backward)},
                     {"head_loss_micro_batch", task.head_loss_micro_batch},
                     {"start_us", round_time_us(task.start_us)},
                     {"end_us", round_time_us(task.end_us)},
                     {"waits_for", waits}};
}

OrderedJson phases_json(const PlanStagePhases& p) {
  return OrderedJson{{"p2p_us", round_time_us(p.p2p_us)},
                     {"p2p_stream", stream_class_name(p.p2p_stream)},
                     {"dp_reduce_hidden_us", round_time_us(p.dp_reduce_hidden_us)},
                     {"dp_reduce_exposed_us", round_time_us(p.dp_reduce_exposed_us)},
                     {"dp_gather_hidden_us", round_time_us(p.dp_gather_hidden_us)},
                     {"dp_gather_exposed_us", round_time_us(p.dp_gather_exposed_us)},
                     {"dp_stream", stream_class_name(p.dp_stream)},
                     {"optimizer_us", round_time_us(p.optimizer_us)}};
}

OrderedJson stage_json(const PlanStage& stage) {
  OrderedJson tasks = OrderedJson::array();
  for (const PlanTask& task : stage.tasks) tasks.push_back(task_json(task));
  OrderedJson out{{"stage", stage.stage},
                  {"ranks", stage.ranks},
                  {"shape_rank", stage.shape_rank},
                  {"pairing", stage.pairing},
                  {"down_layers", range_json(stage.down_layers)},
                  {"up_layers", range_json(stage.up_layers)}};
  if (!stage.model_chunks.empty()) {  // interleaved stages only, so that other plans keep bytes
    OrderedJson chunks = OrderedJson::array();
    for (const PlanLayerRange& range : stage.model_chunks) chunks.push_back(range_json(range));
    out["model_chunks"] = chunks;
  }
  out["embedding"] = stage.embedding;
  out["head_loss"] = stage.head_loss;
  out["tasks"] = tasks;
  if (stage.phases) out["phases"] = phases_json(*stage.phases);
  return out;
}

OrderedJson scheme_json(const PlanScheme& s) {
  OrderedJson comm = OrderedJson::object();
  for (const PlanCommTime& c : s.comm) {
    comm[parallel_dim_name(c.type)] = OrderedJson{{"hidden_us", round_time_us(c.hidden_us)},
                                                  {"exposed_us", round_time_us(c.exposed_us)}};
  }
  OrderedJson memory = OrderedJson::array();
  for (const PlanStageMemory& m : s.memory) {
    memory.push_back(OrderedJson{{"stage", m.stage},
                                 {"weight_bytes", m.weight_bytes},
                                 {"gradient_bytes", m.gradient_bytes},
                                 {"optimizer_bytes", m.optimizer_bytes},
                                 {"activation_bytes", m.activation_bytes},
                                 {"total_bytes", m.total_bytes}});
  }
  return OrderedJson{{"scheme", pipeline_scheme_name(s.scheme)},
                     {"shape", pipeline_shape_name(s.shape)},
                     {"chunks_per_stage", s.chunks_per_stage},
                     {"iteration_us", round_time_us(s.iteration_us)},
                     {"bubble_ratio", round_ratio(s.bubble_ratio)},
                     {"tokens_per_second", round_time_us(s.tokens_per_second)},
                     {"tflops_per_gpu", round_time_us(s.tflops_per_gpu)},
                     {"mfu", round_ratio(s.mfu)},
                     {"speedup_vs_megatron", round_ratio(s.speedup_vs_megatron)},
                     {"comm", comm},
                     {"p2p_transfers", s.p2p_transfers},
                     {"p2p_bytes", s.p2p_bytes},
                     {"fits", s.fits},
                     {"memory", memory}};
}

OrderedJson shape_choice_json(const PlanShapeChoice& c) {
  OrderedJson candidates = OrderedJson::array();
  for (const PlanShapeCandidate& k : c.candidates) {
    OrderedJson candidate{{"shape", pipeline_shape_name(k.shape)},
                          {"split_backward", k.split_backward},
                          {"max_deferred_weight_gradients", k.max_deferred_weight_gradients}};
    if (k.shape == PipelineShape::kInterleaved) candidate["si_blocks"] = k.si_blocks;
    candidate["iteration_us"] = round_time_us(k.iteration_us);
    candidate["bubble_ratio"] = round_ratio(k.bubble_ratio);
    candidate["peak_bytes"] = k.peak_bytes;
    candidate["fits"] = k.fits;
    candidates.push_back(candidate);
  }
  return OrderedJson{{"requested", shape_request_name(c.requested)},
                     {"chosen", pipeline_shape_name(c.chosen)},
                     {"reason", c.reason},
                     {"candidates", candidates}};
}

}  // namespace

double round_time_us(double value_us) { return round_to(value_us, 1e3); }

double round_ratio(double ratio) { return round_to(ratio, 1e6); }

OrderedJson plan_to_json(const Plan& plan) {
  OrderedJson out;
  out["schema_version"] = plan.schema_version;
  out["meta"] = plan.meta;
  out["inputs"] = OrderedJson{{"model", input_ref_json(plan.inputs.model, "name")},
                              {"parallel", plan.inputs.parallel},
                              {"cluster", input_ref_json(plan.inputs.cluster, "name")},
                              {"profile", input_ref_json(plan.inputs.profile, "backend")}};
  out["job"] = OrderedJson{{"name", plan.job.name},
                           {"model", plan.job.model},
                           {"cluster", plan.job.cluster},
                           {"parallel", plan.job.parallel}};
  out["options"] =
      OrderedJson{{"allow_oom", plan.options.allow_oom},
                  {"distributed_optimizer", plan.options.distributed_optimizer},
                  {"cross_layer_max_segment_ops", plan.options.cross_layer_max_segment_ops}};
  if (const auto& fsdp = plan.options.fsdp) {
    out["options"]["fsdp"] =
        OrderedJson{{"sharding_strategy", fsdp_sharding_strategy_name(fsdp->sharding_strategy)},
                    {"reshard_after_forward", fsdp->reshard_after_forward}};
  }
  out["num_micro_batches"] = plan.num_micro_batches;
  OrderedJson pairings = OrderedJson::array();
  for (const PlanPairing& p : plan.pairings) pairings.push_back(pairing_json(p));
  out["pairings"] = pairings;
  OrderedJson stages = OrderedJson::array();
  for (const PlanStage& s : plan.stages) stages.push_back(stage_json(s));
  out["stages"] = stages;
  const PlanMemoryBudget& b = plan.memory_budget;
  out["memory_budget"] = OrderedJson{{"gpu", b.gpu},
                                     {"capacity_bytes", b.capacity_bytes},
                                     {"reserve_bytes", b.reserve_bytes},
                                     {"usable_bytes", b.usable_bytes}};
  OrderedJson schemes = OrderedJson::array();
  for (const PlanScheme& s : plan.schemes) schemes.push_back(scheme_json(s));
  out["schemes"] = schemes;
  if (plan.shape_choice) out["shape_choice"] = shape_choice_json(*plan.shape_choice);
  return out;
}

std::string plan_to_text(const Plan& plan) { return plan_to_json(plan).dump(2) + "\n"; }

void write_plan(const std::string& path, const Plan& plan) {
  write_file_atomically(path, plan_to_text(plan));
}

}  // namespace dhelix
