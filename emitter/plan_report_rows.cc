#include "emitter/plan_report_rows.h"

#include <fmt/format.h>

#include <map>

#include "emitter/svg_pairing.h"
#include "lib/error.h"

namespace dhelix::report_detail {
namespace {

// Below this an op counts as hidden: leftovers of subtracting rounded times.
constexpr double kExposedEpsilonUs = 1e-6;

SchemeRow scheme_row(const PlanScheme& s) {
  SchemeRow row{.scheme = s.scheme,
                .shape = s.shape,
                .chunks_per_stage = s.chunks_per_stage,
                .iteration_us = s.iteration_us,
                .tflops_per_gpu = s.tflops_per_gpu,
                .mfu = s.mfu,
                .bubble_ratio = s.bubble_ratio,
                .speedup_vs_megatron = s.speedup_vs_megatron,
                .fits = s.fits,
                .exposed_comm_us = 0,
                .comm = s.comm,
                .memory = s.memory};
  for (const PlanCommTime& c : s.comm) row.exposed_comm_us += c.exposed_us;
  return row;
}

PairingRow pairing_row(const Plan& plan, size_t i) {
  const PlanPairing& p = plan.pairings[i];
  PairingRow row{.pairing = static_cast<int64_t>(i),
                 .stages = {},
                 .scope = p.scope,
                 .chunk_layers = p.chunk_layers,
                 .window_layers = p.window_layers,
                 .layer_scope_us = p.layer_scope_us,
                 .chunk_scope_us = p.chunk_scope_us,
                 .sequential_us = p.sequential_us,
                 .layer_segment_bound = p.layer_segment_bound,
                 .window_segment_bound = p.window_segment_bound};
  for (const PlanStage& s : plan.stages) {
    if (s.pairing == row.pairing) row.stages.push_back(s.stage);
  }
  return row;
}

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

std::string seconds(double us) { return fmt::format("{:.3f} s", us * 1e-6); }
std::string millis(double us) { return fmt::format("{:.1f} ms", us * 1e-3); }
std::string gib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }

// "fwd.gemm_qkv" -> "gemm_qkv"; other ids unchanged.
std::string short_op(const std::string& id) {
  if (id.starts_with("fwd.") || id.starts_with("bwd.")) return id.substr(4);
  return id;
}

std::string si_comm_cell(const SiComm& c) {
  const std::string marker =
      c.group ? fmt::format("{}, {}", pass_name(c.strand), parallel_dim_name(*c.group))
              : std::string(pass_name(c.strand));
  const std::string state =
      c.exposed_us == 0 ? "hidden" : fmt::format("exposed {}", block_millis(c.exposed_us));
  return fmt::format("{} ({}): {}", short_op(c.op), marker, state);
}

// What the search's work budget bounded (planner/pairing_search.h, 5.), "" when nothing.
std::string budget_clause(const PairingRow& row) {
  std::string out;
  if (row.layer_segment_bound > 0) {
    out += fmt::format(
        "; the search's work budget bounded the layer scope's blocks to {} ops "
        "of each strand",
        row.layer_segment_bound);
  }
  if (row.window_segment_bound > 0) {
    out += fmt::format(
        "; the search's work budget bounded the windows' blocks to {} ops of "
        "each strand",
        row.window_segment_bound);
  }
  return out;
}

// `scheme`'s figures against dhelix's.
BestBaselineRow versus_dhelix(const PlanScheme& scheme, const PlanScheme* dhelix) {
  const bool timed = dhelix != nullptr && dhelix->iteration_us > 0;
  return {.scheme = scheme.scheme,
          .iteration_us = scheme.iteration_us,
          .dhelix_speedup = timed ? scheme.iteration_us / dhelix->iteration_us : 0,
          .dhelix_speedup_vs_1f1b = timed ? dhelix->speedup_vs_megatron : 0};
}

// Why the job rules out the baselines the plan lacks (planner/plan_builder.cc,
// scheme_applies): facts of the job, so an older plan that predates a scheme gets no reason.
std::vector<std::string> absent_reasons(const Plan& plan) {
  std::vector<std::string> out;
  const int64_t pp = static_cast<int64_t>(plan.stages.size());
  if (plan.find_scheme(PipelineScheme::kDualPipeVHandwritten) == nullptr &&
      plan.num_micro_batches < 2 * pp) {
    out.push_back(
        fmt::format("dualpipev-handwritten: DualPipeV needs at least 2·pp = {} "
                    "micro-batches, the job has {}",
                    2 * pp, plan.num_micro_batches));
  }
  const PlanScheme* interleaved = plan.find_scheme(PipelineScheme::kMegatronInterleaved);
  if (plan.find_scheme(PipelineScheme::kMegatronA2aOverlap) == nullptr && pp > 1 &&
      interleaved != nullptr && interleaved->chunks_per_stage == 1) {
    out.push_back(
        "megatron-a2a-overlap: Megatron-Core runs --overlap-moe-expert-parallel-comm with "
        "PP > 1 only on interleaved stages, and the virtual pipeline size is 1");
  }
  return out;
}

}  // namespace

ReportRows report_rows(const Plan& plan) {
  ReportRows rows;
  rows.job = plan.job.name;
  rows.num_micro_batches = plan.num_micro_batches;
  rows.stages = static_cast<int64_t>(plan.stages.size());
  for (const PlanStage& s : plan.stages) rows.gpus += static_cast<int64_t>(s.ranks.size());
  rows.budget = plan.memory_budget;
  for (const PlanScheme& s : plan.schemes) rows.schemes.push_back(scheme_row(s));
  for (size_t i = 0; i < plan.pairings.size(); ++i) rows.pairings.push_back(pairing_row(plan, i));
  if (const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix)) {
    rows.dhelix_memory = dhelix->memory;
  }
  rows.si = si_table(plan);
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  if (const PlanScheme* best = plan.best_baseline())
    rows.best_baseline = versus_dhelix(*best, dhelix);
  if (const PlanScheme* bound = plan.upper_bound())
    rows.upper_bound = versus_dhelix(*bound, dhelix);
  rows.absent = absent_reasons(plan);
  if (const PlanScheme* interleaved = plan.find_scheme(PipelineScheme::kMegatronInterleaved)) {
    const int64_t v = interleaved->chunks_per_stage;
    rows.interleaving =
        fmt::format("megatron-interleaved: virtual pipeline size {}{}", v,
                    v > 1                     ? ""
                    : plan.stages.size() <= 1 ? " (one stage: nothing to interleave)"
                                              : " (Megatron cannot interleave here)");
  }
  if (plan.shape_choice) {
    rows.shape_choice = plan.shape_choice;
    rows.shape_sentence =
        fmt::format("dhelix plan shape: {} ({})", pipeline_shape_name(plan.shape_choice->chosen),
                    plan.shape_choice->reason);
  }
  return rows;
}

std::string best_baseline_sentence(const ReportRows& rows) {
  std::string out = rows.interleaving ? *rows.interleaving + "; " : "";
  if (!rows.best_baseline) return out + "no baseline fits in memory";
  const BestBaselineRow& best = *rows.best_baseline;
  out += fmt::format("best baseline that fits: {} ({:.3f} s)", pipeline_scheme_name(best.scheme),
                     best.iteration_us / 1e6);
  if (best.dhelix_speedup <= 0) return out;
  return out + fmt::format("; dhelix {:.2f}x over it, {:.2f}x over megatron-1f1b",
                           best.dhelix_speedup, best.dhelix_speedup_vs_1f1b);
}

std::string upper_bound_sentence(const ReportRows& rows) {
  std::vector<std::string> parts;
  if (rows.upper_bound) {
    const BestBaselineRow& bound = *rows.upper_bound;
    std::string part = fmt::format("upper bound: {} with the search's pairs ({:.3f} s)",
                                   pipeline_scheme_name(bound.scheme), bound.iteration_us / 1e6);
    if (bound.dhelix_speedup > 0)
      part += fmt::format(", dhelix {:.2f}x of it", bound.dhelix_speedup);
    parts.push_back(part);
  }
  parts.insert(parts.end(), rows.absent.begin(), rows.absent.end());
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string headline(const ReportRows& rows) {
  return fmt::format("{}: {} micro-batches, {} stage{}, {} GPUs ({})", rows.job,
                     rows.num_micro_batches, rows.stages, rows.stages == 1 ? "" : "s", rows.gpus,
                     rows.budget.gpu);
}

std::vector<std::string> scheme_cells(const SchemeRow& row) {
  return {pipeline_scheme_name(row.scheme),
          seconds(row.iteration_us),
          fmt::format("{:.1f}", row.tflops_per_gpu),
          fmt::format("{:.1f}%", 100 * row.mfu),
          fmt::format("{:.1f}%", 100 * row.bubble_ratio),
          millis(row.exposed_comm_us),
          fmt::format("{:.2f}x", row.speedup_vs_megatron),
          row.fits ? "yes" : "NO"};
}

std::string comm_cell(const PlanCommTime& comm) {
  return fmt::format("{} / {}", millis(comm.hidden_us), millis(comm.exposed_us));
}

std::string gib_cell(int64_t bytes) { return gib(bytes) + " GiB"; }

std::vector<std::string> memory_cells(const PlanStageMemory& m) {
  return {std::to_string(m.stage), gib(m.total_bytes),     gib(m.weight_bytes),
          gib(m.gradient_bytes),   gib(m.optimizer_bytes), gib(m.activation_bytes)};
}

std::string pairing_sentence(const PairingRow& row) {
  std::string stages;
  for (int64_t s : row.stages) stages += fmt::format("{}{}", stages.empty() ? "" : ",", s);
  return fmt::format(
             "pairing {} (stages {}): scope {}; SI block of {} layers: layer scope {}, chunk scope "
             "({}-layer windows) {}, strands one after the other {}",
             row.pairing, stages, kPairingScopeNames.name(row.scope), row.chunk_layers,
             millis(row.layer_scope_us), row.window_layers, millis(row.chunk_scope_us),
             millis(row.sequential_us)) +
         budget_clause(row);
}

std::string memory_title(const ReportRows& rows) {
  return fmt::format("dhelix memory per GPU ({} GiB usable on {})", gib(rows.budget.usable_bytes),
                     rows.budget.gpu);
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

std::vector<std::string> short_ops(const std::vector<std::string>& ids) {
  std::vector<std::string> out;
  for (const std::string& id : ids) out.push_back(short_op(id));
  return out;
}

std::vector<std::string> comm_cells(const SiBlock& block) {
  std::vector<std::string> out;
  for (const SiComm& c : block.comm) out.push_back(si_comm_cell(c));
  return out;
}

std::string block_millis(double us) { return fmt::format("{:.3f} ms", us * 1e-3); }

}  // namespace dhelix::report_detail
