// The markdown form of the plan report: the text form's cells (plan_report_rows.h) in
// GitHub tables, one section per table.

#include <fmt/format.h>

#include <algorithm>

#include "emitter/plan_report_rows.h"

namespace dhelix::report_detail {
namespace {

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

std::string md_comparison(const ReportRows& rows) {
  std::string out = md_header(
      {"scheme", "iteration", "TFLOPS/GPU", "MFU", "bubble", "exposed comm", "speed-up", "fits"},
      {false, true, true, true, true, true, true, false});
  for (const SchemeRow& s : rows.schemes) {
    std::vector<std::string> cells = scheme_cells(s);
    cells[0] = md_escape(cells[0]);
    out += md_row(cells);
  }
  out += "\n" + md_escape(best_baseline_sentence(rows)) + ".\n";
  const std::string bound = upper_bound_sentence(rows);
  if (!bound.empty()) out += "\n" + md_escape(bound) + ".\n";
  return rows.shape_sentence ? out + "\n" + md_escape(*rows.shape_sentence) + ".\n" : out;
}

std::string md_comm(const ReportRows& rows) {
  std::vector<std::string> names = {"scheme"};
  std::vector<bool> right = {false};
  for (ParallelDim type : kParallelDimNames.values()) {
    names.push_back(parallel_dim_name(type));
    right.push_back(true);
  }
  std::string out =
      "## Communication per GPU and iteration (hidden / exposed)\n\n" + md_header(names, right);
  for (const SchemeRow& s : rows.schemes) {
    std::vector<std::string> cells = {md_escape(pipeline_scheme_name(s.scheme))};
    for (ParallelDim type : kParallelDimNames.values()) {
      auto it = std::find_if(s.comm.begin(), s.comm.end(),
                             [&](const PlanCommTime& c) { return c.type == type; });
      cells.push_back(it == s.comm.end() ? "-" : comm_cell(*it));
    }
    out += md_row(cells);
  }
  return out;
}

std::string md_peak_memory(const ReportRows& rows) {
  size_t stages = 0;
  for (const SchemeRow& s : rows.schemes) stages = std::max(stages, s.memory.size());
  std::vector<std::string> names = {"scheme"};
  std::vector<bool> right = {false};
  for (size_t i = 0; i < stages; ++i) {
    names.push_back(fmt::format("stage {}", i));
    right.push_back(true);
  }
  std::string out = "## Peak memory per GPU by stage\n\n" + md_header(names, right);
  for (const SchemeRow& s : rows.schemes) {
    std::vector<std::string> cells = {md_escape(pipeline_scheme_name(s.scheme))};
    for (size_t i = 0; i < stages; ++i) {
      cells.push_back(i < s.memory.size() ? gib_cell(s.memory[i].total_bytes) : "-");
    }
    out += md_row(cells);
  }
  return out;
}

std::string md_pairings(const ReportRows& rows) {
  std::string out = "## Pairings\n\n";
  for (const PairingRow& p : rows.pairings) out += "- " + pairing_sentence(p) + "\n";
  return out;
}

std::string md_memory(const ReportRows& rows) {
  if (!rows.dhelix_memory) return "";
  std::string out =
      "## " + memory_title(rows) + "\n\n" +
      md_header({"stage", "total GiB", "weights", "gradients", "optimizer", "activations"},
                {true, true, true, true, true, true});
  for (const PlanStageMemory& m : *rows.dhelix_memory) out += md_row(memory_cells(m));
  return out;
}

std::string md_si(const ReportRows& rows) {
  if (!rows.si) return "";
  std::string out =
      "## " + si_title() + "\n\n" +
      md_header({"block", "forward compute", "backward compute", "communication", "time"},
                {true, false, false, false, true});
  for (size_t b = 0; b < rows.si->blocks.size(); ++b) {
    const SiBlock& block = rows.si->blocks[b];
    out += md_row({std::to_string(b), md_lines(short_ops(block.forward_ops)),
                   md_lines(short_ops(block.backward_ops)), md_lines(comm_cells(block)),
                   block_millis(block.time_us)});
  }
  return out + "\n" + si_footer(*rows.si) + "\n";
}

}  // namespace

std::string render_report_markdown(const ReportRows& rows) {
  const std::vector<std::string> sections = {
      "# " + md_escape(headline(rows)) + "\n\n" + md_comparison(rows),
      md_comm(rows),
      md_peak_memory(rows),
      md_pairings(rows),
      md_memory(rows),
      md_si(rows)};
  std::string out;
  for (const std::string& s : sections) {
    if (s.empty()) continue;
    out += (out.empty() ? "" : "\n") + s;
  }
  return out;
}

}  // namespace dhelix::report_detail
