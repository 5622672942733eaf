// The JSON form of the plan report: the rows' numbers, times rounded to 3 decimals (us) and
// ratios to 6, here and nowhere else, so that the same plan gives the same bytes.

#include <cmath>

#include "emitter/plan_report.h"
#include "emitter/plan_report_rows.h"

namespace dhelix::report_detail {
namespace {

// Adding 0.0 turns -0.0 into 0.0.
double rounded(double value, double scale) { return std::round(value * scale) / scale + 0.0; }
double us(double value) { return rounded(value, 1e3); }
double ratio(double value) { return rounded(value, 1e6); }

OrderedJson scheme_json(const SchemeRow& s) {
  OrderedJson comm = OrderedJson::object();
  for (const PlanCommTime& c : s.comm) {
    comm[parallel_dim_name(c.type)] = {{"hidden_us", us(c.hidden_us)},
                                       {"exposed_us", us(c.exposed_us)}};
  }
  OrderedJson memory = OrderedJson::array();
  for (const PlanStageMemory& m : s.memory) {
    memory.push_back({{"stage", m.stage},
                      {"total_bytes", m.total_bytes},
                      {"weight_bytes", m.weight_bytes},
                      {"gradient_bytes", m.gradient_bytes},
                      {"optimizer_bytes", m.optimizer_bytes},
                      {"activation_bytes", m.activation_bytes}});
  }
  return {{"scheme", pipeline_scheme_name(s.scheme)},
          {"shape", pipeline_shape_name(s.shape)},
          {"chunks_per_stage", s.chunks_per_stage},
          {"iteration_us", us(s.iteration_us)},
          {"tflops_per_gpu", ratio(s.tflops_per_gpu)},
          {"mfu", ratio(s.mfu)},
          {"bubble_ratio", ratio(s.bubble_ratio)},
          {"speedup_vs_megatron", ratio(s.speedup_vs_megatron)},
          {"fits", s.fits},
          {"exposed_comm_us", us(s.exposed_comm_us)},
          {"comm", comm},
          {"peak_memory", memory}};
}

OrderedJson pairings_json(const ReportRows& rows) {
  OrderedJson out = OrderedJson::array();
  for (const PairingRow& p : rows.pairings) {
    out.push_back({{"pairing", p.pairing},
                   {"stages", p.stages},
                   {"scope", kPairingScopeNames.name(p.scope)},
                   {"chunk_layers", p.chunk_layers},
                   {"window_layers", p.window_layers},
                   {"layer_scope_us", us(p.layer_scope_us)},
                   {"chunk_scope_us", us(p.chunk_scope_us)},
                   {"sequential_us", us(p.sequential_us)}});
  }
  return out;
}

OrderedJson si_json(const ReportRows& rows) {
  if (!rows.si) return nullptr;
  const SiTable& table = *rows.si;
  OrderedJson blocks = OrderedJson::array();
  for (size_t b = 0; b < table.blocks.size(); ++b) {
    const SiBlock& block = table.blocks[b];
    OrderedJson comm = OrderedJson::array();
    for (const SiComm& c : block.comm) {
      comm.push_back({{"op", c.op},
                      {"strand", pass_name(c.strand)},
                      {"group", c.group ? parallel_dim_name(*c.group) : ""},
                      {"time_us", us(c.time_us)},
                      {"hidden_us", us(c.time_us - c.exposed_us)},
                      {"exposed_us", us(c.exposed_us)},
                      {"hidden_under", c.hidden_under}});
    }
    blocks.push_back({{"block", static_cast<int64_t>(b)},
                      {"time_us", us(block.time_us)},
                      {"forward_ops", block.forward_ops},
                      {"backward_ops", block.backward_ops},
                      {"comm", comm}});
  }
  return {{"pairing", 0},
          {"scope", kPairingScopeNames.name(PairingScope::kLayer)},
          {"layer_pair_us", us(table.layer_pair_us)},
          {"sequential_us", us(table.sequential_us)},
          {"comm_us", us(table.comm_us)},
          {"hidden_us", us(table.comm_us - table.exposed_us)},
          {"exposed_us", us(table.exposed_us)},
          {"blocks", blocks}};
}

// A scheme's time and dhelix's speed-up over it (the best baseline that fits, or the
// upper bound); null when there is none.
OrderedJson versus_dhelix_json(const std::optional<BestBaselineRow>& row) {
  if (!row) return nullptr;
  return {{"scheme", pipeline_scheme_name(row->scheme)},
          {"iteration_us", us(row->iteration_us)},
          {"dhelix_speedup", ratio(row->dhelix_speedup)}};
}

}  // namespace

std::string render_report_json(const ReportRows& rows) {
  OrderedJson schemes = OrderedJson::array();
  for (const SchemeRow& s : rows.schemes) schemes.push_back(scheme_json(s));
  OrderedJson out = {{"schema_version", kPlanReportSchemaVersion},
                     {"job", rows.job},
                     {"num_micro_batches", rows.num_micro_batches},
                     {"stages", rows.stages},
                     {"gpus", rows.gpus},
                     {"memory_budget",
                      {{"gpu", rows.budget.gpu},
                       {"capacity_bytes", rows.budget.capacity_bytes},
                       {"reserve_bytes", rows.budget.reserve_bytes},
                       {"usable_bytes", rows.budget.usable_bytes}}},
                     {"schemes", schemes},
                     {"best_baseline", versus_dhelix_json(rows.best_baseline)},
                     {"upper_bound", versus_dhelix_json(rows.upper_bound)},
                     {"absent_baselines", rows.absent},
                     {"pairings", pairings_json(rows)},
                     {"si_pairing", si_json(rows)}};
  if (rows.shape_choice) {
    out["shape"] = {{"chosen", pipeline_shape_name(rows.shape_choice->chosen)},
                    {"requested", shape_request_name(rows.shape_choice->requested)},
                    {"reason", rows.shape_choice->reason}};
  }
  return out.dump(2) + "\n";
}

}  // namespace dhelix::report_detail
