// plan_diff_to_json: the diff for machines. Keys in a fixed order and numbers rounded
// (times and ratios to 6 decimals, relative changes to 9), so that the same two plans give
// the same bytes. Figures are listed whether changed or not (with "changed"), so that a CI
// script can read any number without knowing which ones moved; blocks are listed only
// when they are not the same.

#include <cmath>

#include "emitter/plan_diff.h"

namespace dhelix {
namespace {

// Adding 0.0 turns -0.0 into 0.0, so that a tiny negative change does not print "-0.0".
double rounded(double value, double scale) { return std::round(value * scale) / scale + 0.0; }

// Six decimals while that fits a double's 53 bits exactly enough, three beyond.
double tidy(double value) {
  return std::abs(value) < 1e9 ? rounded(value, 1e6) : rounded(value, 1e3);
}

OrderedJson number(double value, bool integer) {
  if (integer) return static_cast<int64_t>(std::llround(value));
  return tidy(value);
}

// A FieldChange's JSON texts back as values; "" (absent) is null.
OrderedJson field_value(const std::string& text) {
  return text.empty() ? OrderedJson(nullptr) : OrderedJson::parse(text);
}

OrderedJson fields_json(const std::vector<FieldChange>& fields) {
  OrderedJson out = OrderedJson::array();
  for (const FieldChange& field : fields) {
    out.push_back(
        {{"field", field.field}, {"a", field_value(field.a)}, {"b", field_value(field.b)}});
  }
  return out;
}

OrderedJson number_json(const NumberChange& change) {
  const std::optional<double> relative = change.relative();
  return {{"field", change.field},
          {"a", number(change.a, change.integer)},
          {"b", number(change.b, change.integer)},
          {"delta", number(change.delta(), change.integer)},
          {"relative", relative ? OrderedJson(rounded(*relative, 1e9)) : OrderedJson(nullptr)},
          {"changed", change.changed}};
}

OrderedJson numbers_json(const std::vector<NumberChange>& changes) {
  OrderedJson out = OrderedJson::array();
  for (const NumberChange& change : changes) out.push_back(number_json(change));
  return out;
}

OrderedJson index_json(int64_t index) {
  return index < 0 ? OrderedJson(nullptr) : OrderedJson(index);
}

OrderedJson block_json(const BlockDiff& block) {
  return {{"list", block.list},
          {"index_a", index_json(block.index_a)},
          {"index_b", index_json(block.index_b)},
          {"status", block_status_name(block.status)},
          {"time_a_us", tidy(block.time_a_us)},
          {"time_b_us", tidy(block.time_b_us)},
          {"ops_added", block.ops_added},
          {"ops_removed", block.ops_removed}};
}

OrderedJson pairing_json(const PairingDiff& diff) {
  OrderedJson counts = OrderedJson::object();
  for (BlockStatus status : {BlockStatus::kSame, BlockStatus::kRetimed, BlockStatus::kChanged,
                             BlockStatus::kAdded, BlockStatus::kRemoved}) {
    counts[block_status_name(status)] = 0;
  }
  OrderedJson blocks = OrderedJson::array();
  for (const BlockDiff& block : diff.blocks) {
    counts[block_status_name(block.status)] =
        counts[block_status_name(block.status)].get<int64_t>() + 1;
    if (block.status != BlockStatus::kSame) blocks.push_back(block_json(block));
  }
  return {{"stages", diff.stages},
          {"pairing_a", diff.pairing_a},
          {"pairing_b", diff.pairing_b},
          {"fields", fields_json(diff.fields)},
          {"times", numbers_json(diff.times)},
          {"block_counts", counts},
          {"blocks", blocks},
          {"ops_retimed", diff.ops_retimed}};
}

OrderedJson pairing_section_json(const PairingSection& section) {
  OrderedJson templates = OrderedJson::array();
  for (const PairingDiff& diff : section.pairings) templates.push_back(pairing_json(diff));
  return {{"stages_a", section.stages_a},
          {"stages_b", section.stages_b},
          {"stage_fields", fields_json(section.stage_fields)},
          {"templates", templates}};
}

OrderedJson scheme_json(const SchemeDiff& scheme) {
  return {{"scheme", pipeline_scheme_name(scheme.scheme)},
          {"in_a", scheme.in_a},
          {"in_b", scheme.in_b},
          {"fields", fields_json(scheme.fields)},
          {"figures", numbers_json(scheme.figures)}};
}

}  // namespace

OrderedJson plan_diff_to_json(const PlanDiff& diff, const OrderedJson& meta) {
  OrderedJson out = OrderedJson::object();
  out["schema_version"] = kPlanDiffSchemaVersion;
  out["meta"] = meta;
  out["relative_tolerance"] = diff.relative_tolerance;
  out["identical"] = diff.identical();
  out["plan_changed"] = diff.plan_changed();
  out["summary"] = diff.summary;
  out["inputs"] = fields_json(diff.inputs);
  out["pairing"] = pairing_section_json(diff.pairing);
  OrderedJson schemes = OrderedJson::array();
  for (const SchemeDiff& scheme : diff.schemes) schemes.push_back(scheme_json(scheme));
  out["schemes"] = schemes;
  out["failures"] = diff.failures;
  return out;
}

}  // namespace dhelix
