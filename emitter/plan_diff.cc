// diff_plans: provenance, predicted figures, summary and CI failures. The pairing part is
// in plan_diff_pairing.cc, the renderers in plan_diff_text.cc and plan_diff_json.cc.

#include "emitter/plan_diff.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "emitter/plan_diff_internal.h"
#include "lib/text.h"

namespace dhelix {

using diff_detail::number_change;

namespace diff_detail {

NumberChange number_change(std::string field, double a, double b, double relative_tolerance,
                           bool integer) {
  NumberChange out;
  out.field = std::move(field);
  out.a = a;
  out.b = b;
  out.changed = numbers_differ(a, b, relative_tolerance);
  out.integer = integer;
  return out;
}

}  // namespace diff_detail

namespace {

// `time_us` in the unit format_duration_us picks for `unit_of_us`, so that the two sides
// of "from 4.1 ms to 0.9 ms" share one unit.
std::string format_duration_in(double time_us, double unit_of_us) {
  const double magnitude = std::abs(unit_of_us);
  if (magnitude < 1e3) return fmt::format("{:.1f} us", time_us);
  if (magnitude < 1e6) return fmt::format("{:.1f} ms", time_us / 1e3);
  return fmt::format("{:.3f} s", time_us / 1e6);
}

// "4.1 ms" and "0.9 ms": both in the unit of the larger.
std::pair<std::string, std::string> format_durations(double a_us, double b_us) {
  const double unit = std::max(std::abs(a_us), std::abs(b_us));
  return {format_duration_in(a_us, unit), format_duration_in(b_us, unit)};
}

// ---- provenance ------------------------------------------------------------------------

void add_field(std::vector<FieldChange>& out, std::string field, const OrderedJson& a,
               const OrderedJson& b) {
  if (a != b)
    out.push_back({std::move(field), a.is_null() ? "" : a.dump(), b.is_null() ? "" : b.dump()});
}

OrderedJson member(const OrderedJson& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key)) return nullptr;
  return object.at(key);
}

// Keys of `a` in its order, then keys only `b` has, in its order.
std::vector<std::string> key_union(const OrderedJson& a, const OrderedJson& b) {
  std::vector<std::string> keys;
  for (const OrderedJson* object : {&a, &b}) {
    if (!object->is_object()) continue;
    for (const auto& item : object->items()) {
      if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) {
        keys.push_back(item.key());
      }
    }
  }
  return keys;
}

std::vector<FieldChange> diff_inputs(const Plan& a, const Plan& b) {
  std::vector<FieldChange> out;
  add_field(out, "job.name", a.job.name, b.job.name);
  add_field(out, "model.name", a.inputs.model.name, b.inputs.model.name);
  add_field(out, "model.sha256", a.inputs.model.sha256, b.inputs.model.sha256);
  for (const std::string& key : key_union(a.inputs.parallel, b.inputs.parallel)) {
    add_field(out, "parallel." + key, member(a.inputs.parallel, key),
              member(b.inputs.parallel, key));
  }
  add_field(out, "cluster.name", a.inputs.cluster.name, b.inputs.cluster.name);
  add_field(out, "cluster.sha256", a.inputs.cluster.sha256, b.inputs.cluster.sha256);
  add_field(out, "profile.backend", a.inputs.profile.name, b.inputs.profile.name);
  add_field(out, "profile.sha256", a.inputs.profile.sha256, b.inputs.profile.sha256);
  add_field(out, "options.allow_oom", a.options.allow_oom, b.options.allow_oom);
  add_field(out, "options.distributed_optimizer", a.options.distributed_optimizer,
            b.options.distributed_optimizer);
  add_field(out, "options.cross_layer_max_segment_ops", a.options.cross_layer_max_segment_ops,
            b.options.cross_layer_max_segment_ops);
  add_field(out, "num_micro_batches", a.num_micro_batches, b.num_micro_batches);
  add_field(out, "memory_budget.gpu", a.memory_budget.gpu, b.memory_budget.gpu);
  add_field(out, "memory_budget.usable_bytes", a.memory_budget.usable_bytes,
            b.memory_budget.usable_bytes);
  add_field(out, "tool.version", member(a.meta, "version"), member(b.meta, "version"));
  add_field(out, "tool.git_hash", member(a.meta, "git_hash"), member(b.meta, "git_hash"));
  return out;
}

// ---- predicted figures -----------------------------------------------------------------

const PlanCommTime* find_comm(const PlanScheme& scheme, ParallelDim type) {
  for (const PlanCommTime& comm : scheme.comm) {
    if (comm.type == type) return &comm;
  }
  return nullptr;
}

const PlanStageMemory* find_memory(const PlanScheme& scheme, int64_t stage) {
  for (const PlanStageMemory& memory : scheme.memory) {
    if (memory.stage == stage) return &memory;
  }
  return nullptr;
}

void diff_memory(const PlanScheme& a, const PlanScheme& b, double tol, SchemeDiff& out) {
  for (const PlanStageMemory& ma : a.memory) {
    const PlanStageMemory* mb = find_memory(b, ma.stage);
    if (mb == nullptr) continue;
    const std::string prefix = "memory." + std::to_string(ma.stage) + ".";
    const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> sizes = {
        {"weight_bytes", {ma.weight_bytes, mb->weight_bytes}},
        {"gradient_bytes", {ma.gradient_bytes, mb->gradient_bytes}},
        {"optimizer_bytes", {ma.optimizer_bytes, mb->optimizer_bytes}},
        {"activation_bytes", {ma.activation_bytes, mb->activation_bytes}},
        {"total_bytes", {ma.total_bytes, mb->total_bytes}},
    };
    for (const auto& [field, values] : sizes) {
      out.figures.push_back(number_change(prefix + field, static_cast<double>(values.first),
                                          static_cast<double>(values.second), tol, true));
    }
  }
}

SchemeDiff diff_scheme(const PlanScheme& a, const PlanScheme& b, double tol) {
  SchemeDiff out;
  out.scheme = a.scheme;
  add_field(out.fields, "shape", std::string(pipeline_shape_name(a.shape)),
            std::string(pipeline_shape_name(b.shape)));
  add_field(out.fields, "chunks_per_stage", a.chunks_per_stage, b.chunks_per_stage);
  add_field(out.fields, "fits", a.fits, b.fits);
  const std::vector<std::pair<std::string, std::pair<double, double>>> figures = {
      {"iteration_us", {a.iteration_us, b.iteration_us}},
      {"bubble_ratio", {a.bubble_ratio, b.bubble_ratio}},
      {"tokens_per_second", {a.tokens_per_second, b.tokens_per_second}},
      {"tflops_per_gpu", {a.tflops_per_gpu, b.tflops_per_gpu}},
      {"mfu", {a.mfu, b.mfu}},
      {"speedup_vs_megatron", {a.speedup_vs_megatron, b.speedup_vs_megatron}},
  };
  for (const auto& [field, values] : figures) {
    out.figures.push_back(number_change(field, values.first, values.second, tol));
  }
  for (ParallelDim type : kParallelDimNames.values()) {
    const PlanCommTime* ca = find_comm(a, type);
    const PlanCommTime* cb = find_comm(b, type);
    if (ca == nullptr || cb == nullptr) continue;
    const std::string prefix = std::string("comm.") + parallel_dim_name(type);
    out.figures.push_back(
        number_change(prefix + ".exposed_us", ca->exposed_us, cb->exposed_us, tol));
    out.figures.push_back(number_change(prefix + ".hidden_us", ca->hidden_us, cb->hidden_us, tol));
  }
  out.figures.push_back(number_change("p2p_transfers", static_cast<double>(a.p2p_transfers),
                                      static_cast<double>(b.p2p_transfers), tol, true));
  out.figures.push_back(number_change("p2p_bytes", static_cast<double>(a.p2p_bytes),
                                      static_cast<double>(b.p2p_bytes), tol, true));
  diff_memory(a, b, tol, out);
  return out;
}

std::vector<SchemeDiff> diff_schemes(const Plan& a, const Plan& b, double tol) {
  std::vector<SchemeDiff> out;
  // Schemes in the order a plan lists them (the reader knows no others).
  for (PipelineScheme name : kPipelineSchemeNames.values()) {
    const PlanScheme* sa = a.find_scheme(name);
    const PlanScheme* sb = b.find_scheme(name);
    if (sa == nullptr && sb == nullptr) continue;
    if (sa != nullptr && sb != nullptr) {
      out.push_back(diff_scheme(*sa, *sb, tol));
      continue;
    }
    SchemeDiff one_sided;
    one_sided.scheme = name;
    one_sided.in_a = sa != nullptr;
    one_sided.in_b = sb != nullptr;
    out.push_back(std::move(one_sided));
  }
  return out;
}

const SchemeDiff* find_scheme_diff(const PlanDiff& diff, PipelineScheme name) {
  for (const SchemeDiff& scheme : diff.schemes) {
    if (scheme.scheme == name && scheme.in_a && scheme.in_b) return &scheme;
  }
  return nullptr;
}

const NumberChange* find_figure(const SchemeDiff& scheme, const std::string& field) {
  for (const NumberChange& figure : scheme.figures) {
    if (figure.field == field) return &figure;
  }
  return nullptr;
}

// ---- summary and failures --------------------------------------------------------------

struct BlockCounts {
  int64_t total = 0;
  int64_t structural = 0;
  int64_t retimed = 0;
};

BlockCounts count_blocks(const PairingSection& pairing) {
  BlockCounts counts;
  for (const PairingDiff& template_diff : pairing.pairings) {
    for (const BlockDiff& block : template_diff.blocks) {
      ++counts.total;
      if (block.status == BlockStatus::kRetimed) ++counts.retimed;
    }
    counts.structural += template_diff.structural_changes();
  }
  return counts;
}

int64_t changed_figures(const PlanDiff& diff) {
  int64_t count = 0;
  for (const SchemeDiff& scheme : diff.schemes) {
    count += static_cast<int64_t>(scheme.fields.size());
    for (const NumberChange& figure : scheme.figures) count += figure.changed ? 1 : 0;
  }
  return count;
}

std::string inputs_sentence(const std::vector<FieldChange>& inputs) {
  std::vector<std::string> parts;
  for (const FieldChange& field : inputs) {
    const bool hash = field.field.ends_with("sha256") || field.field.ends_with("git_hash");
    parts.push_back(hash ? field.field
                         : fmt::format("{} {} -> {}", field.field, field.a.empty() ? "-" : field.a,
                                       field.b.empty() ? "-" : field.b));
  }
  constexpr size_t kShown = 4;
  const size_t hidden = parts.size() > kShown ? parts.size() - kShown : 0;
  parts.resize(parts.size() - hidden);
  std::string text = "The plans were made for different inputs: " + join(parts, ", ");
  if (hidden > 0) text += fmt::format(" and {} more", hidden);
  return text + ".";
}

std::string speed_sentence(const NumberChange& iteration) {
  if (!iteration.changed) {
    return fmt::format("dhelix's iteration time is the same ({}).",
                       format_duration_us(iteration.a));
  }
  const double pct = std::abs(iteration.delta()) / iteration.a * 100;
  const auto [from, to] = format_durations(iteration.a, iteration.b);
  if (iteration.b < iteration.a) {
    // A speed-up is a ratio: 83.9 s -> 12.4 s is 6.77x faster, or 85.2 % less time (not
    // "85.2 % faster", which would be 1.85x).
    return fmt::format("dhelix is {:.2f}x faster on B ({:.1f} % less time): iteration {} -> {}.",
                       iteration.a / iteration.b, pct, from, to);
  }
  return fmt::format("dhelix is {:.1f} % slower on B: iteration {} -> {}.", pct, from, to);
}

// "Exposed TP communication fell from 4.1 ms to 0.9 ms" for the (at most two) types whose
// exposed time moved most; "" when none moved.
std::string comm_sentence(const SchemeDiff& dhelix) {
  std::vector<const NumberChange*> moved;
  for (const NumberChange& figure : dhelix.figures) {
    if (figure.changed && figure.field.starts_with("comm.") &&
        figure.field.ends_with(".exposed_us")) {
      moved.push_back(&figure);
    }
  }
  std::stable_sort(moved.begin(), moved.end(), [](const NumberChange* x, const NumberChange* y) {
    return std::abs(x->delta()) > std::abs(y->delta());
  });
  std::string text;
  for (size_t i = 0; i < std::min<size_t>(moved.size(), 2); ++i) {
    std::string type = moved[i]->field.substr(5, moved[i]->field.find('.', 5) - 5);
    std::transform(type.begin(), type.end(), type.begin(), ::toupper);
    const auto [from, to] = format_durations(moved[i]->a, moved[i]->b);
    text += fmt::format("{}{} {} communication {} from {} to {}", i == 0 ? "" : "; ",
                        i == 0 ? "Exposed" : "exposed", type,
                        moved[i]->b < moved[i]->a ? "fell" : "rose", from, to);
  }
  return text.empty() ? text : text + ".";
}

std::string pairing_sentence(const PairingSection& pairing) {
  const BlockCounts counts = count_blocks(pairing);
  std::string text;
  if (pairing.stages_a != pairing.stages_b) {
    text = fmt::format("The plans have {} and {} stages; ", pairing.stages_a, pairing.stages_b);
  }
  if (counts.structural == 0 && counts.retimed == 0) {
    return text + (text.empty() ? "The" : "the") + " pairing is the same.";
  }
  text += fmt::format("{} pairing changed in {} of {} blocks", text.empty() ? "The" : "the",
                      counts.structural, counts.total);
  if (counts.retimed > 0) text += fmt::format(" ({} more retimed)", counts.retimed);
  return text + ".";
}

// Peak memory of the dhelix scheme: the largest stage total.
std::string memory_sentence(const SchemeDiff& dhelix) {
  double peak_a = 0, peak_b = 0;
  for (const NumberChange& figure : dhelix.figures) {
    if (!figure.field.starts_with("memory.") || !figure.field.ends_with(".total_bytes")) continue;
    peak_a = std::max(peak_a, figure.a);
    peak_b = std::max(peak_b, figure.b);
  }
  if (!numbers_differ(peak_a, peak_b, 0)) return "";
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return fmt::format("Peak memory per GPU {} from {:.2f} GiB to {:.2f} GiB.",
                     peak_b < peak_a ? "fell" : "rose", peak_a / kGiB, peak_b / kGiB);
}

// The fastest baseline that fits (Plan::best_baseline) and dhelix's gain over it, when
// either changed from A to B.
std::string best_baseline_sentence(const Plan& a, const Plan& b) {
  const auto gain = [](const Plan& plan, const PlanScheme* best) {
    const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
    return best != nullptr && dhelix != nullptr && dhelix->iteration_us > 0
               ? best->iteration_us / dhelix->iteration_us
               : 0.0;
  };
  const PlanScheme* best_a = a.best_baseline();
  const PlanScheme* best_b = b.best_baseline();
  const std::string name_a = best_a ? pipeline_scheme_name(best_a->scheme) : "none";
  const std::string name_b = best_b ? pipeline_scheme_name(best_b->scheme) : "none";
  const double gain_a = gain(a, best_a);
  const double gain_b = gain(b, best_b);
  if (name_a == name_b && std::abs(gain_a - gain_b) < 0.005) return "";
  const std::string names = name_a == name_b ? name_a : name_a + " -> " + name_b;
  return fmt::format("Best baseline that fits: {}; dhelix's gain over it {:.2f}x -> {:.2f}x.",
                     names, gain_a, gain_b);
}

std::vector<std::string> make_summary(const PlanDiff& diff) {
  if (diff.identical()) return {"The plans are identical."};
  std::vector<std::string> out;
  if (!diff.inputs.empty()) out.push_back(inputs_sentence(diff.inputs));
  if (!diff.plan_changed()) {
    out.push_back("The pairing and the predicted figures are the same.");
    return out;
  }
  const SchemeDiff* dhelix = find_scheme_diff(diff, PipelineScheme::kDHelix);
  const NumberChange* iteration = dhelix ? find_figure(*dhelix, "iteration_us") : nullptr;
  if (iteration != nullptr) out.push_back(speed_sentence(*iteration));
  if (dhelix != nullptr) {
    for (std::string sentence : {comm_sentence(*dhelix), memory_sentence(*dhelix)}) {
      if (!sentence.empty()) out.push_back(std::move(sentence));
    }
  }
  out.push_back(pairing_sentence(diff.pairing));
  return out;
}

std::vector<std::string> find_failures(const PlanDiff& diff, const DiffOptions& options) {
  std::vector<std::string> out;
  if (options.fail_if_slower_pct) {
    const SchemeDiff* dhelix = find_scheme_diff(diff, PipelineScheme::kDHelix);
    const NumberChange* iteration = dhelix ? find_figure(*dhelix, "iteration_us") : nullptr;
    if (iteration == nullptr) {
      out.push_back("--fail-if-slower: the dhelix scheme is missing from a plan");
    } else if (iteration->changed && iteration->a > 0) {
      const double growth_pct = iteration->delta() / iteration->a * 100;
      if (growth_pct > *options.fail_if_slower_pct) {
        const auto [from, to] = format_durations(iteration->a, iteration->b);
        out.push_back(fmt::format("dhelix iteration time grew {:.1f} % (> {:g} %): {} -> {}",
                                  growth_pct, *options.fail_if_slower_pct, from, to));
      }
    }
  }
  if (options.fail_if_changed && diff.plan_changed()) {
    const BlockCounts counts = count_blocks(diff.pairing);
    out.push_back(fmt::format(
        "the plans differ: {} of {} pairing blocks changed, {} retimed; {} predicted figures "
        "changed",
        counts.structural, counts.total, counts.retimed, changed_figures(diff)));
  }
  return out;
}

}  // namespace

std::optional<double> NumberChange::relative() const {
  if (a == 0) return std::nullopt;
  return (b - a) / std::abs(a);
}

const char* block_status_name(BlockStatus status) {
  switch (status) {
    case BlockStatus::kSame:
      return "same";
    case BlockStatus::kRetimed:
      return "retimed";
    case BlockStatus::kChanged:
      return "changed";
    case BlockStatus::kAdded:
      return "added";
    case BlockStatus::kRemoved:
      return "removed";
  }
  return "?";
}

int64_t PairingDiff::structural_changes() const {
  int64_t count = 0;
  for (const BlockDiff& block : blocks) {
    count += block.status == BlockStatus::kSame || block.status == BlockStatus::kRetimed ? 0 : 1;
  }
  return count;
}

bool PlanDiff::plan_changed() const {
  if (pairing.stages_a != pairing.stages_b || !pairing.stage_fields.empty()) return true;
  for (const PairingDiff& template_diff : pairing.pairings) {
    if (!template_diff.fields.empty() || template_diff.ops_retimed > 0) return true;
    for (const NumberChange& time : template_diff.times) {
      if (time.changed) return true;
    }
    for (const BlockDiff& block : template_diff.blocks) {
      if (block.status != BlockStatus::kSame) return true;
    }
  }
  for (const SchemeDiff& scheme : schemes) {
    if (!scheme.in_a || !scheme.in_b || !scheme.fields.empty()) return true;
    for (const NumberChange& figure : scheme.figures) {
      if (figure.changed) return true;
    }
  }
  return false;
}

bool numbers_differ(double a, double b, double relative_tolerance) {
  return std::abs(b - a) > relative_tolerance * std::max(std::abs(a), std::abs(b));
}

PlanDiff diff_plans(const Plan& a, const Plan& b, const DiffOptions& options) {
  DHELIX_CHECK(options.relative_tolerance >= 0);
  PlanDiff diff;
  diff.relative_tolerance = options.relative_tolerance;
  diff.inputs = diff_inputs(a, b);
  diff.pairing = diff_detail::diff_pairing_section(a, b, options.relative_tolerance);
  diff.schemes = diff_schemes(a, b, options.relative_tolerance);
  diff.summary = make_summary(diff);
  if (std::string sentence = best_baseline_sentence(a, b);
      !sentence.empty() && diff.plan_changed()) {
    diff.summary.push_back(std::move(sentence));
  }
  diff.failures = find_failures(diff, options);
  return diff;
}

std::string format_duration_us(double time_us) { return format_duration_in(time_us, time_us); }

}  // namespace dhelix
