#include "emitter/plan_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "emitter/svg_pairing.h"
#include "lib/error.h"

namespace dhelix {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Below this an op counts as hidden: leftovers of subtracting rounded times.
constexpr double kExposedEpsilonUs = 1e-6;

// ---------------------------------------------------------------------------------------
// Figures shared by the three forms.

double exposed_us(const PlanScheme& s) {
  double total = 0;
  for (const PlanCommTime& c : s.comm) total += c.exposed_us;
  return total;
}

int64_t gpu_count(const Plan& plan) {
  int64_t gpus = 0;
  for (const PlanStage& s : plan.stages) gpus += static_cast<int64_t>(s.ranks.size());
  return gpus;
}

std::string headline(const Plan& plan) {
  return fmt::format("{}: {} micro-batches, {} stage{}, {} GPUs ({})", plan.job.name,
                     plan.num_micro_batches, plan.stages.size(), plan.stages.size() == 1 ? "" : "s",
                     gpu_count(plan), plan.memory_budget.gpu);
}

std::string seconds(double us) { return fmt::format("{:.3f} s", us * 1e-6); }
std::string millis(double us) { return fmt::format("{:.1f} ms", us * 1e-3); }
std::string block_millis(double us) { return fmt::format("{:.3f} ms", us * 1e-3); }

std::string stage_list(const Plan& plan, size_t pairing) {
  std::string stages;
  for (const PlanStage& s : plan.stages) {
    if (s.pairing == static_cast<int64_t>(pairing))
      stages += fmt::format("{}{}", stages.empty() ? "" : ",", s.stage);
  }
  return stages;
}

std::string scope_sentence(const Plan& plan, size_t i) {
  const PlanPairing& p = plan.pairings[i];
  return fmt::format(
      "pairing {} (stages {}): scope {}; SI block of {} layers: layer scope {}, chunk scope "
      "({}-layer windows) {}, strands one after the other {}",
      i, stage_list(plan, i), kPairingScopeNames.name(p.scope), p.chunk_layers,
      millis(p.layer_scope_us), p.window_layers, millis(p.chunk_scope_us), millis(p.sequential_us));
}

std::string memory_title(const Plan& plan) {
  return fmt::format("dhelix memory per GPU ({:.2f} GiB usable on {})",
                     plan.memory_budget.usable_bytes / kGiB, plan.memory_budget.gpu);
}

// One communication op of an SI block, as the report shows it.
struct SiComm {
  std::string op;  // full id
  Pass strand = Pass::kForward;
  std::optional<ParallelDim> group;
  double time_us = 0;
  double exposed_us = 0;
  std::vector<std::string> hidden_under;
};

// One SI block: its compute ops per strand (start order) and its communication ops.
struct SiBlock {
  double time_us = 0;
  std::vector<std::string> forward_ops;
  std::vector<std::string> backward_ops;
  std::vector<SiComm> comm;
};

// The SI pairing of one layer: pairing 0's layer-scope blocks.
struct SiTable {
  double layer_pair_us = 0;
  double sequential_us = 0;  // one layer's forward alone + its backward alone
  double comm_us = 0;
  double exposed_us = 0;
  std::vector<SiBlock> blocks;
};

std::vector<std::string> compute_only(const std::vector<std::string>& ids,
                                      const std::map<std::string, const PlanOp*>& ops) {
  std::vector<std::string> out;
  for (const std::string& id : ids) {
    auto it = ops.find(id);
    if (it == ops.end()) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("plan: pairing 0: a layer block names op '{}', which the pairing "
                              "lacks",
                              id));
    }
    if (it->second->stream == StreamClass::kCompute) out.push_back(id);
  }
  return out;
}

std::optional<SiTable> si_table(const Plan& plan) {
  if (plan.pairings.empty()) return std::nullopt;
  const PlanPairing& pairing = plan.pairings.front();
  std::map<std::string, const PlanOp*> ops;
  for (const auto* list : {&pairing.forward_ops, &pairing.backward_ops}) {
    for (const PlanOp& op : *list) ops.emplace(op.id, &op);
  }
  SiTable table;
  table.layer_pair_us = pairing.layer_pair_us;
  table.sequential_us = pairing.chunk_layers > 0
                            ? pairing.sequential_us / static_cast<double>(pairing.chunk_layers)
                            : 0;
  for (const PlanBlock& b : pairing.layer_blocks) {
    table.blocks.push_back({.time_us = b.time_us,
                            .forward_ops = compute_only(b.forward_ops, ops),
                            .backward_ops = compute_only(b.backward_ops, ops),
                            .comm = {}});
  }
  for (const CommOverlap& o : comm_overlaps(pairing, pairing.layer_blocks)) {
    const auto op = ops.find(o.op);
    const double exposed = o.exposed_us < kExposedEpsilonUs ? 0 : o.exposed_us;
    table.comm_us += o.time_us;
    table.exposed_us += exposed;
    table.blocks[static_cast<size_t>(o.block)].comm.push_back(
        {.op = o.op,
         .strand = o.strand,
         .group = op == ops.end() ? std::nullopt : op->second->group,
         .time_us = o.time_us,
         .exposed_us = exposed,
         .hidden_under = o.hidden_under});
  }
  return table;
}

// "fwd.gemm_qkv" -> "gemm_qkv"; other ids unchanged.
std::string short_op(const std::string& id) {
  if (id.starts_with("fwd.") || id.starts_with("bwd.")) return id.substr(4);
  return id;
}

std::string comm_cell(const SiComm& c) {
  const std::string marker =
      c.group ? fmt::format("{}, {}", pass_name(c.strand), parallel_dim_name(*c.group))
              : std::string(pass_name(c.strand));
  const std::string state =
      c.exposed_us == 0 ? "hidden" : fmt::format("exposed {}", block_millis(c.exposed_us));
  return fmt::format("{} ({}): {}", short_op(c.op), marker, state);
}

std::vector<std::string> short_ops(const std::vector<std::string>& ids) {
  std::vector<std::string> out;
  for (const std::string& id : ids) out.push_back(short_op(id));
  return out;
}

std::vector<std::string> comm_cells(const SiBlock& b) {
  std::vector<std::string> out;
  for (const SiComm& c : b.comm) out.push_back(comm_cell(c));
  return out;
}

std::string si_title() {
  return "SI pairing of one layer (pairing 0, layer scope): forward of micro-batch j beside "
         "backward of micro-batch j - pp";
}

std::string si_footer(const SiTable& t) {
  const std::string ratio =
      t.layer_pair_us > 0 ? fmt::format(" ({:.2f}x)", t.sequential_us / t.layer_pair_us) : "";
  return fmt::format(
      "layer pair {} vs strands one after the other {}{}; communication {}: {} hidden, {} "
      "exposed",
      block_millis(t.layer_pair_us), block_millis(t.sequential_us), ratio, block_millis(t.comm_us),
      block_millis(t.comm_us - t.exposed_us), block_millis(t.exposed_us));
}

// ---------------------------------------------------------------------------------------
// Text.

// The sentence under the scheme table: the fastest baseline that fits in memory and dhelix's
// gain over it, beside the gain over plain 1F1B (speedup_vs_megatron).
std::string best_baseline_sentence(const Plan& plan) {
  const PlanScheme* dhelix = plan.find_scheme("dhelix");
  const PlanScheme* best = plan.best_baseline();
  std::string out;
  if (const PlanScheme* interleaved = plan.find_scheme("megatron-interleaved")) {
    out += fmt::format("megatron-interleaved: virtual pipeline size {}{}; ",
                       interleaved->chunks_per_stage,
                       interleaved->chunks_per_stage > 1 ? ""
                       : plan.stages.size() <= 1         ? " (one stage: nothing to interleave)"
                                                         : " (Megatron cannot interleave here)");
  }
  if (best == nullptr) return out + "no baseline fits in memory";
  out += fmt::format("best baseline that fits: {} ({})", best->scheme, seconds(best->iteration_us));
  if (dhelix == nullptr || !(dhelix->iteration_us > 0)) return out;
  return out + fmt::format("; dhelix {:.2f}x over it, {:.2f}x over megatron-1f1b",
                           best->iteration_us / dhelix->iteration_us, dhelix->speedup_vs_megatron);
}

std::string comparison_table(const Plan& plan) {
  std::string out =
      fmt::format("{:<20} {:>11} {:>11} {:>7} {:>7} {:>13} {:>9} {:>5}\n", "scheme", "iteration",
                  "TFLOPS/GPU", "MFU", "bubble", "exposed comm", "speed-up", "fits");
  for (const PlanScheme& s : plan.schemes) {
    out += fmt::format("{:<20} {:>11} {:>11.1f} {:>6.1f}% {:>6.1f}% {:>13} {:>8.2f}x {:>5}\n",
                       s.scheme, seconds(s.iteration_us), s.tflops_per_gpu, 100 * s.mfu,
                       100 * s.bubble_ratio, millis(exposed_us(s)), s.speedup_vs_megatron,
                       s.fits ? "yes" : "NO");
  }
  return out + best_baseline_sentence(plan) + "\n";
}

std::string exposed_by_type(const Plan& plan) {
  std::string out = "communication per GPU and iteration, hidden / exposed:\n";
  for (const PlanScheme& s : plan.schemes) {
    std::string parts;
    for (const PlanCommTime& c : s.comm) {
      if (c.hidden_us == 0 && c.exposed_us == 0) continue;
      parts += fmt::format("  {} {} / {}", c.type, millis(c.hidden_us), millis(c.exposed_us));
    }
    out += fmt::format("  {:<20}{}\n", s.scheme, parts.empty() ? "  none" : parts);
  }
  return out;
}

std::string peak_memory(const Plan& plan) {
  std::string out = "peak memory per GPU by stage:\n";
  for (const PlanScheme& s : plan.schemes) {
    std::string parts;
    for (const PlanStageMemory& m : s.memory) {
      parts += fmt::format("  stage {} {:.2f} GiB", m.stage, m.total_bytes / kGiB);
    }
    out += fmt::format("  {:<20}{}\n", s.scheme, parts.empty() ? "  unknown" : parts);
  }
  return out;
}

std::string scopes(const Plan& plan) {
  std::string out;
  for (size_t i = 0; i < plan.pairings.size(); ++i) out += scope_sentence(plan, i) + "\n";
  return out;
}

std::string memory(const Plan& plan) {
  const PlanScheme* dhelix = plan.find_scheme("dhelix");
  if (dhelix == nullptr) return "";
  std::string out = memory_title(plan) + ":\n";
  for (const PlanStageMemory& m : dhelix->memory) {
    out += fmt::format(
        "  stage {}: {:.2f} GiB = weights {:.2f} + gradients {:.2f} + optimizer {:.2f} + "
        "activations {:.2f}\n",
        m.stage, m.total_bytes / kGiB, m.weight_bytes / kGiB, m.gradient_bytes / kGiB,
        m.optimizer_bytes / kGiB, m.activation_bytes / kGiB);
  }
  return out;
}

// A table whose cells hold several lines each; the last column is right-aligned.
using Cell = std::vector<std::string>;

std::string text_table(const std::vector<std::vector<Cell>>& rows) {
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      for (const std::string& line : row[c]) widths[c] = std::max(widths[c], line.size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    size_t height = 1;
    for (const Cell& cell : row) height = std::max(height, cell.size());
    for (size_t l = 0; l < height; ++l) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        const std::string text = l < row[c].size() ? row[c][l] : "";
        if (c + 1 == row.size()) {
          line += fmt::format("{:>{}}", text, widths[c]);
        } else {
          line += fmt::format("{:<{}}  ", text, widths[c]);
        }
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
  }
  return out;
}

std::string si_text(const Plan& plan) {
  const std::optional<SiTable> table = si_table(plan);
  if (!table) return "";
  std::vector<std::vector<Cell>> rows = {
      {{"block"}, {"forward compute"}, {"backward compute"}, {"communication"}, {"time"}}};
  for (size_t b = 0; b < table->blocks.size(); ++b) {
    const SiBlock& block = table->blocks[b];
    rows.push_back({{std::to_string(b)},
                    short_ops(block.forward_ops),
                    short_ops(block.backward_ops),
                    comm_cells(block),
                    {block_millis(block.time_us)}});
  }
  return si_title() + "\n" + text_table(rows) + si_footer(*table) + "\n";
}

// ---------------------------------------------------------------------------------------
// Markdown.

std::string md_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string md_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += (out.empty() ? "" : "<br>") + md_escape(line);
  return out;
}

std::string md_row(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const std::string& cell : cells) out += " " + cell + " |";
  return out + "\n";
}

// Header row and the alignment row; `right` marks right-aligned (numeric) columns.
std::string md_header(const std::vector<std::string>& names, const std::vector<bool>& right) {
  std::vector<std::string> rule;
  for (bool r : right) rule.push_back(r ? "---:" : "---");
  return md_row(names) + md_row(rule);
}

std::string md_comparison(const Plan& plan) {
  std::string out = md_header(
      {"scheme", "iteration", "TFLOPS/GPU", "MFU", "bubble", "exposed comm", "speed-up", "fits"},
      {false, true, true, true, true, true, true, false});
  for (const PlanScheme& s : plan.schemes) {
    out += md_row({md_escape(s.scheme), seconds(s.iteration_us),
                   fmt::format("{:.1f}", s.tflops_per_gpu), fmt::format("{:.1f}%", 100 * s.mfu),
                   fmt::format("{:.1f}%", 100 * s.bubble_ratio), millis(exposed_us(s)),
                   fmt::format("{:.2f}x", s.speedup_vs_megatron), s.fits ? "yes" : "NO"});
  }
  return out + "\n" + md_escape(best_baseline_sentence(plan)) + ".\n";
}

std::string md_comm(const Plan& plan) {
  std::vector<std::string> names = {"scheme"};
  std::vector<bool> right = {false};
  for (const std::string& type : plan_comm_types()) {
    names.push_back(type);
    right.push_back(true);
  }
  std::string out =
      "## Communication per GPU and iteration (hidden / exposed)\n\n" + md_header(names, right);
  for (const PlanScheme& s : plan.schemes) {
    std::vector<std::string> cells = {md_escape(s.scheme)};
    for (const std::string& type : plan_comm_types()) {
      auto it = std::find_if(s.comm.begin(), s.comm.end(),
                             [&](const PlanCommTime& c) { return c.type == type; });
      cells.push_back(it == s.comm.end()
                          ? "-"
                          : fmt::format("{} / {}", millis(it->hidden_us), millis(it->exposed_us)));
    }
    out += md_row(cells);
  }
  return out;
}

std::string md_peak_memory(const Plan& plan) {
  size_t stages = 0;
  for (const PlanScheme& s : plan.schemes) stages = std::max(stages, s.memory.size());
  std::vector<std::string> names = {"scheme"};
  std::vector<bool> right = {false};
  for (size_t i = 0; i < stages; ++i) {
    names.push_back(fmt::format("stage {}", i));
    right.push_back(true);
  }
  std::string out = "## Peak memory per GPU by stage\n\n" + md_header(names, right);
  for (const PlanScheme& s : plan.schemes) {
    std::vector<std::string> cells = {md_escape(s.scheme)};
    for (size_t i = 0; i < stages; ++i) {
      cells.push_back(
          i < s.memory.size() ? fmt::format("{:.2f} GiB", s.memory[i].total_bytes / kGiB) : "-");
    }
    out += md_row(cells);
  }
  return out;
}

std::string md_scopes(const Plan& plan) {
  std::string out = "## Pairings\n\n";
  for (size_t i = 0; i < plan.pairings.size(); ++i) out += "- " + scope_sentence(plan, i) + "\n";
  return out;
}

std::string md_memory(const Plan& plan) {
  const PlanScheme* dhelix = plan.find_scheme("dhelix");
  if (dhelix == nullptr) return "";
  std::string out =
      "## " + memory_title(plan) + "\n\n" +
      md_header({"stage", "total GiB", "weights", "gradients", "optimizer", "activations"},
                {true, true, true, true, true, true});
  for (const PlanStageMemory& m : dhelix->memory) {
    out += md_row({std::to_string(m.stage), fmt::format("{:.2f}", m.total_bytes / kGiB),
                   fmt::format("{:.2f}", m.weight_bytes / kGiB),
                   fmt::format("{:.2f}", m.gradient_bytes / kGiB),
                   fmt::format("{:.2f}", m.optimizer_bytes / kGiB),
                   fmt::format("{:.2f}", m.activation_bytes / kGiB)});
  }
  return out;
}

std::string md_si(const Plan& plan) {
  const std::optional<SiTable> table = si_table(plan);
  if (!table) return "";
  std::string out =
      "## " + si_title() + "\n\n" +
      md_header({"block", "forward compute", "backward compute", "communication", "time"},
                {true, false, false, false, true});
  for (size_t b = 0; b < table->blocks.size(); ++b) {
    const SiBlock& block = table->blocks[b];
    out += md_row({std::to_string(b), md_lines(short_ops(block.forward_ops)),
                   md_lines(short_ops(block.backward_ops)), md_lines(comm_cells(block)),
                   block_millis(block.time_us)});
  }
  return out + "\n" + si_footer(*table) + "\n";
}

std::string markdown(const Plan& plan) {
  std::vector<std::string> sections = {
      "# " + md_escape(headline(plan)) + "\n\n" + md_comparison(plan),
      md_comm(plan),
      md_peak_memory(plan),
      md_scopes(plan),
      md_memory(plan),
      md_si(plan)};
  std::string out;
  for (const std::string& s : sections) {
    if (s.empty()) continue;
    out += (out.empty() ? "" : "\n") + s;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// JSON.

// Adding 0.0 turns -0.0 into 0.0.
double rounded(double value, double scale) { return std::round(value * scale) / scale + 0.0; }
double us(double value) { return rounded(value, 1e3); }
double ratio(double value) { return rounded(value, 1e6); }

OrderedJson scheme_json(const PlanScheme& s) {
  OrderedJson comm = OrderedJson::object();
  for (const PlanCommTime& c : s.comm) {
    comm[c.type] = {{"hidden_us", us(c.hidden_us)}, {"exposed_us", us(c.exposed_us)}};
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
  return {{"scheme", s.scheme},
          {"chunks_per_stage", s.chunks_per_stage},
          {"iteration_us", us(s.iteration_us)},
          {"tflops_per_gpu", ratio(s.tflops_per_gpu)},
          {"mfu", ratio(s.mfu)},
          {"bubble_ratio", ratio(s.bubble_ratio)},
          {"speedup_vs_megatron", ratio(s.speedup_vs_megatron)},
          {"fits", s.fits},
          {"exposed_comm_us", us(exposed_us(s))},
          {"comm", comm},
          {"peak_memory", memory}};
}

OrderedJson pairings_json(const Plan& plan) {
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < plan.pairings.size(); ++i) {
    const PlanPairing& p = plan.pairings[i];
    OrderedJson stages = OrderedJson::array();
    for (const PlanStage& s : plan.stages) {
      if (s.pairing == static_cast<int64_t>(i)) stages.push_back(s.stage);
    }
    out.push_back({{"pairing", static_cast<int64_t>(i)},
                   {"stages", stages},
                   {"scope", kPairingScopeNames.name(p.scope)},
                   {"chunk_layers", p.chunk_layers},
                   {"window_layers", p.window_layers},
                   {"layer_scope_us", us(p.layer_scope_us)},
                   {"chunk_scope_us", us(p.chunk_scope_us)},
                   {"sequential_us", us(p.sequential_us)}});
  }
  return out;
}

OrderedJson si_json(const Plan& plan) {
  const std::optional<SiTable> table = si_table(plan);
  if (!table) return nullptr;
  OrderedJson blocks = OrderedJson::array();
  for (size_t b = 0; b < table->blocks.size(); ++b) {
    const SiBlock& block = table->blocks[b];
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
          {"scope", "layer"},
          {"layer_pair_us", us(table->layer_pair_us)},
          {"sequential_us", us(table->sequential_us)},
          {"comm_us", us(table->comm_us)},
          {"hidden_us", us(table->comm_us - table->exposed_us)},
          {"exposed_us", us(table->exposed_us)},
          {"blocks", blocks}};
}

// The fastest baseline that fits and dhelix's speed-up over it; null when none fits.
OrderedJson best_baseline_json(const Plan& plan) {
  const PlanScheme* best = plan.best_baseline();
  const PlanScheme* dhelix = plan.find_scheme("dhelix");
  if (best == nullptr) return nullptr;
  const double gain =
      dhelix != nullptr && dhelix->iteration_us > 0 ? best->iteration_us / dhelix->iteration_us : 0;
  return {{"scheme", best->scheme},
          {"iteration_us", us(best->iteration_us)},
          {"dhelix_speedup", ratio(gain)}};
}

std::string json(const Plan& plan) {
  OrderedJson schemes = OrderedJson::array();
  for (const PlanScheme& s : plan.schemes) schemes.push_back(scheme_json(s));
  const OrderedJson out = {{"schema_version", kPlanReportSchemaVersion},
                           {"job", plan.job.name},
                           {"num_micro_batches", plan.num_micro_batches},
                           {"stages", static_cast<int64_t>(plan.stages.size())},
                           {"gpus", gpu_count(plan)},
                           {"memory_budget",
                            {{"gpu", plan.memory_budget.gpu},
                             {"capacity_bytes", plan.memory_budget.capacity_bytes},
                             {"reserve_bytes", plan.memory_budget.reserve_bytes},
                             {"usable_bytes", plan.memory_budget.usable_bytes}}},
                           {"schemes", schemes},
                           {"best_baseline", best_baseline_json(plan)},
                           {"pairings", pairings_json(plan)},
                           {"si_pairing", si_json(plan)}};
  return out.dump(2) + "\n";
}

}  // namespace

const char* report_format_name(ReportFormat format) {
  switch (format) {
    case ReportFormat::kText:
      return "text";
    case ReportFormat::kMarkdown:
      return "markdown";
    case ReportFormat::kJson:
      return "json";
  }
  DHELIX_CHECK(false);
  return "";
}

std::optional<ReportFormat> parse_report_format(const std::string& name) {
  for (ReportFormat f : {ReportFormat::kText, ReportFormat::kMarkdown, ReportFormat::kJson}) {
    if (name == report_format_name(f)) return f;
  }
  return std::nullopt;
}

std::string render_plan_report(const Plan& plan, ReportFormat format) {
  switch (format) {
    case ReportFormat::kText:
      return plan_report_text(plan);
    case ReportFormat::kMarkdown:
      return markdown(plan);
    case ReportFormat::kJson:
      return json(plan);
  }
  DHELIX_CHECK(false);
  return "";
}

std::string plan_report_text(const Plan& plan) {
  std::string out = headline(plan) + "\n";
  out += comparison_table(plan);
  out += exposed_by_type(plan);
  out += peak_memory(plan);
  out += scopes(plan);
  out += memory(plan);
  out += si_text(plan);
  return out;
}

}  // namespace dhelix
