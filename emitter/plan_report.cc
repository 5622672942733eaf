// The plan report's entry points and its text form; the rows come from
// plan_report_rows.cc, the markdown and JSON forms from plan_report_markdown.cc and
// plan_report_json.cc.

#include "emitter/plan_report.h"

#include <fmt/format.h>

#include <algorithm>

#include "emitter/plan_report_rows.h"
#include "lib/error.h"

namespace dhelix {
namespace report_detail {
namespace {

std::string comparison_table(const ReportRows& rows) {
  constexpr const char* kRow = "{:<22} {:>11} {:>11} {:>7} {:>7} {:>13} {:>9} {:>5}\n";
  std::string out = fmt::format(kRow, "scheme", "iteration", "TFLOPS/GPU", "MFU", "bubble",
                                "exposed comm", "speed-up", "fits");
  for (const SchemeRow& s : rows.schemes) {
    const std::vector<std::string> c = scheme_cells(s);
    out += fmt::format(kRow, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
  }
  out += best_baseline_sentence(rows) + "\n";
  const std::string bound = upper_bound_sentence(rows);
  if (!bound.empty()) out += bound + "\n";
  return rows.shape_sentence ? out + *rows.shape_sentence + "\n" : out;
}

std::string comm_by_type(const ReportRows& rows) {
  std::string out = "communication per GPU and iteration, hidden / exposed:\n";
  for (const SchemeRow& s : rows.schemes) {
    std::string parts;
    for (const PlanCommTime& c : s.comm) {
      if (c.hidden_us == 0 && c.exposed_us == 0) continue;
      parts += fmt::format("  {} {}", parallel_dim_name(c.type), comm_cell(c));
    }
    out += fmt::format("  {:<22}{}\n", pipeline_scheme_name(s.scheme),
                       parts.empty() ? "  none" : parts);
  }
  return out;
}

std::string peak_memory(const ReportRows& rows) {
  std::string out = "peak memory per GPU by stage:\n";
  for (const SchemeRow& s : rows.schemes) {
    std::string parts;
    for (const PlanStageMemory& m : s.memory) {
      parts += fmt::format("  stage {} {}", m.stage, gib_cell(m.total_bytes));
    }
    out += fmt::format("  {:<22}{}\n", pipeline_scheme_name(s.scheme),
                       parts.empty() ? "  unknown" : parts);
  }
  return out;
}

std::string pairings(const ReportRows& rows) {
  std::string out;
  for (const PairingRow& p : rows.pairings) out += pairing_sentence(p) + "\n";
  return out;
}

std::string dhelix_memory(const ReportRows& rows) {
  if (!rows.dhelix_memory) return "";
  std::string out = memory_title(rows) + ":\n";
  for (const PlanStageMemory& m : *rows.dhelix_memory) {
    const std::vector<std::string> c = memory_cells(m);
    out += fmt::format(
        "  stage {}: {} GiB = weights {} + gradients {} + optimizer {} + activations {}\n", c[0],
        c[1], c[2], c[3], c[4], c[5]);
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

std::string si_text(const ReportRows& rows) {
  if (!rows.si) return "";
  std::vector<std::vector<Cell>> table = {
      {{"block"}, {"forward compute"}, {"backward compute"}, {"communication"}, {"time"}}};
  for (size_t b = 0; b < rows.si->blocks.size(); ++b) {
    const SiBlock& block = rows.si->blocks[b];
    table.push_back({{std::to_string(b)},
                     short_ops(block.forward_ops),
                     short_ops(block.backward_ops),
                     comm_cells(block),
                     {block_millis(block.time_us)}});
  }
  return si_title() + "\n" + text_table(table) + si_footer(*rows.si) + "\n";
}

}  // namespace

std::string render_report_text(const ReportRows& rows) {
  return headline(rows) + "\n" + comparison_table(rows) + comm_by_type(rows) + peak_memory(rows) +
         pairings(rows) + dhelix_memory(rows) + si_text(rows);
}

}  // namespace report_detail

namespace {
constexpr EnumNames<ReportFormat, 3> kReportFormatNames{{"text", "markdown", "json"}};
}  // namespace

const char* report_format_name(ReportFormat format) { return kReportFormatNames.name(format); }

std::optional<ReportFormat> parse_report_format(const std::string& name) {
  return kReportFormatNames.parse(name);
}

std::string render_plan_report(const Plan& plan, ReportFormat format) {
  const report_detail::ReportRows rows = report_detail::report_rows(plan);
  switch (format) {
    case ReportFormat::kText:
      return report_detail::render_report_text(rows);
    case ReportFormat::kMarkdown:
      return report_detail::render_report_markdown(rows);
    case ReportFormat::kJson:
      return report_detail::render_report_json(rows);
  }
  DHELIX_CHECK(false);
  return "";
}

std::string plan_report_text(const Plan& plan) {
  return render_plan_report(plan, ReportFormat::kText);
}

}  // namespace dhelix
