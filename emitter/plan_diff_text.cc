// plan_diff_to_text: the diff for a terminal. Only what differs is listed; unchanged
// sections say "same" in one line, so that a small change stands out in a large plan.

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "emitter/plan_diff.h"

namespace dhelix {
namespace {

std::string number_text(double value, bool integer) {
  // Shortest text that reads back as the same double: the plan's own rounded digits.
  return integer ? fmt::format("{}", static_cast<int64_t>(value)) : fmt::format("{}", value);
}

std::string change_line(const NumberChange& change) {
  std::string line =
      fmt::format("{:<28} {} -> {}", change.field, number_text(change.a, change.integer),
                  number_text(change.b, change.integer));
  const std::optional<double> relative = change.relative();
  if (relative) line += fmt::format("  ({:+.2f} %)", *relative * 100);
  return line;
}

std::string field_line(const FieldChange& change) {
  return fmt::format("{:<28} {} -> {}", change.field, change.a.empty() ? "(absent)" : change.a,
                     change.b.empty() ? "(absent)" : change.b);
}

// "0-3, 5": ascending stage indices with runs collapsed.
std::string stage_list(const std::vector<int64_t>& stages) {
  std::string text;
  for (size_t i = 0; i < stages.size();) {
    size_t j = i;
    while (j + 1 < stages.size() && stages[j + 1] == stages[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(stages[i]);
    if (j > i) text += "-" + std::to_string(stages[j]);
    i = j + 1;
  }
  return text;
}

std::string joined(const std::vector<std::string>& items, const std::string& prefix) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : " ") + prefix + item;
  return text;
}

std::string block_line(const BlockDiff& block) {
  switch (block.status) {
    case BlockStatus::kAdded:
      return fmt::format("{} block {} added ({}): {}", block.list, block.index_b,
                         format_duration_us(block.time_b_us), joined(block.ops_added, ""));
    case BlockStatus::kRemoved:
      return fmt::format("{} block {} removed ({}): {}", block.list, block.index_a,
                         format_duration_us(block.time_a_us), joined(block.ops_removed, ""));
    default:
      break;
  }
  std::string ops = joined(block.ops_added, "+");
  const std::string removed = joined(block.ops_removed, "-");
  ops += (ops.empty() || removed.empty() ? "" : " ") + removed;
  return fmt::format("{} block {} -> {} {}: {}{} -> {}", block.list, block.index_a, block.index_b,
                     block_status_name(block.status), ops.empty() ? "op order; " : ops + "; ",
                     format_duration_us(block.time_a_us), format_duration_us(block.time_b_us));
}

void append_pairing(const PairingDiff& diff, std::string& out) {
  out += fmt::format("  stages {} (template {} in A, {} in B):\n", stage_list(diff.stages),
                     diff.pairing_a, diff.pairing_b);
  for (const FieldChange& field : diff.fields) out += "    " + field_line(field) + "\n";
  for (const NumberChange& time : diff.times) {
    if (time.changed) out += "    " + change_line(time) + "\n";
  }
  int64_t counts[5] = {0, 0, 0, 0, 0};  // by BlockStatus, kSame (0) to kRemoved (4)
  for (const BlockDiff& block : diff.blocks) ++counts[static_cast<int>(block.status)];
  out += fmt::format("    blocks: {} same, {} retimed, {} changed, {} added, {} removed\n",
                     counts[0], counts[1], counts[2], counts[3], counts[4]);
  for (const BlockDiff& block : diff.blocks) {
    if (block.status != BlockStatus::kSame && block.status != BlockStatus::kRetimed) {
      out += "    " + block_line(block) + "\n";
    }
  }
  if (diff.ops_retimed > 0)
    out += fmt::format("    ops with another solo time: {}\n", diff.ops_retimed);
}

void append_scheme(const SchemeDiff& scheme, std::string& out) {
  if (!scheme.in_a || !scheme.in_b) {
    out += fmt::format("  {}: only in {}\n", pipeline_scheme_name(scheme.scheme),
                       scheme.in_a ? "A" : "B");
    return;
  }
  int64_t unchanged = 0;
  std::string lines;
  for (const FieldChange& field : scheme.fields) lines += "    " + field_line(field) + "\n";
  for (const NumberChange& figure : scheme.figures) {
    if (figure.changed) {
      lines += "    " + change_line(figure) + "\n";
    } else {
      ++unchanged;
    }
  }
  if (lines.empty()) {
    out += fmt::format("  {}: same\n", pipeline_scheme_name(scheme.scheme));
    return;
  }
  out += fmt::format("  {}: ({} figures unchanged)\n", pipeline_scheme_name(scheme.scheme),
                     unchanged) +
         lines;
}

}  // namespace

std::string plan_diff_to_text(const PlanDiff& diff) {
  std::string out = fmt::format("A: {}\nB: {}\n\nSummary:\n", diff.label_a, diff.label_b);
  for (const std::string& sentence : diff.summary) out += "  " + sentence + "\n";

  out += "\nInputs:\n";
  if (diff.inputs.empty()) out += "  same\n";
  for (const FieldChange& field : diff.inputs) out += "  " + field_line(field) + "\n";

  out += "\nPairing:\n";
  const PairingSection& pairing = diff.pairing;
  if (pairing.stages_a != pairing.stages_b) {
    out += fmt::format("  stages: {} -> {}\n", pairing.stages_a, pairing.stages_b);
  }
  for (const FieldChange& field : pairing.stage_fields) out += "  " + field_line(field) + "\n";
  for (const PairingDiff& template_diff : pairing.pairings) append_pairing(template_diff, out);

  out += fmt::format("\nPredicted figures (relative tolerance {:g}):\n", diff.relative_tolerance);
  for (const SchemeDiff& scheme : diff.schemes) append_scheme(scheme, out);

  if (!diff.failures.empty()) {
    out += "\nFailed checks:\n";
    for (const std::string& failure : diff.failures) out += "  " + failure + "\n";
  }
  return out;
}

}  // namespace dhelix
