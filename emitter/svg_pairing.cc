#include "emitter/svg_pairing.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "emitter/svg_writer.h"
#include "emitter/task_expansion.h"
#include "lib/error.h"

namespace dhelix {
namespace {

constexpr double kWidth = 1400;
constexpr double kLeft = 96;
constexpr double kRight = 24;
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kHeaderHeight = 74;
constexpr double kPanelTitleHeight = 24;
constexpr double kBlockRowHeight = 30;
constexpr double kLaneHeight = 44;
constexpr double kLaneGap = 6;
constexpr double kAxisHeight = 30;
constexpr double kCaptionLine = 17;
constexpr double kTableLine = 15;
constexpr double kPanelGap = 18;
constexpr double kOpLabelSize = 10;
constexpr double kSmallLabelSize = 8;

constexpr const char* kExposedFill = "#d62728";

struct Interval {
  double from_us = 0;
  double to_us = 0;
};

class OpLookup {
 public:
  explicit OpLookup(const PlanPairing& pairing) {
    for (const auto* ops : {&pairing.forward_ops, &pairing.backward_ops}) {
      for (const PlanOp& op : *ops) ops_.emplace(op.id, &op);
    }
  }
  const PlanOp& at(const std::string& timing_op) const {
    auto it = ops_.find(split_window_op_id(timing_op).second);
    if (it == ops_.end()) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("plan: pairing: block timing names op '{}', which the pairing lacks",
                              timing_op));
    }
    return *it->second;
  }

 private:
  std::map<std::string, const PlanOp*> ops_;
};

// The parts of `span` that no interval of `cover` overlaps.
std::vector<Interval> uncovered(Interval span, std::vector<Interval> cover) {
  std::sort(cover.begin(), cover.end(),
            [](const Interval& a, const Interval& b) { return a.from_us < b.from_us; });
  std::vector<Interval> out;
  double t = span.from_us;
  for (const Interval& c : cover) {
    if (c.to_us <= t || c.from_us >= span.to_us) continue;
    if (c.from_us > t) out.push_back({t, c.from_us});
    t = std::max(t, c.to_us);
  }
  if (t < span.to_us) out.push_back({t, span.to_us});
  return out;
}

std::vector<Interval> compute_intervals(const OpLookup& lookup, const PlanBlock& block) {
  std::vector<Interval> out;
  for (const PlanOpTiming& t : block.timings) {
    if (lookup.at(t.op).stream == StreamClass::kCompute) out.push_back({t.start_us, t.finish_us});
  }
  return out;
}

std::string short_name(const std::string& timing_op) {
  const auto [k, id] = split_window_op_id(timing_op);
  const size_t dot = id.find('.');
  const std::string bare = dot == std::string::npos ? id : id.substr(dot + 1);
  return timing_op == id ? bare : fmt::format("L{}.{}", k, bare);
}

double blocks_time_us(const std::vector<PlanBlock>& blocks) {
  double total = 0;
  for (const PlanBlock& b : blocks) total += b.time_us;
  return total;
}

// One panel: a list of blocks drawn over [0, total time].
struct Panel {
  const std::vector<PlanBlock>* blocks = nullptr;
  std::string title;
  double sequential_us = 0;  // the same work with the strands one after the other
  bool table = false;
  double scale = 1;  // px per us
  double x(double time_us) const { return kLeft + time_us * scale; }
};

int64_t table_rows(const std::vector<CommOverlap>& overlaps) {
  return (static_cast<int64_t>(overlaps.size()) + 1) / 2;
}

double panel_height(const Panel& p, const std::vector<CommOverlap>& overlaps) {
  double h = kPanelTitleHeight + kBlockRowHeight + 3 * (kLaneHeight + kLaneGap) + kAxisHeight +
             2 * kCaptionLine;
  if (p.table) h += kCaptionLine + static_cast<double>(table_rows(overlaps)) * kTableLine;
  return h;
}

// Lanes top to bottom in the streams' enum order.
double lane_y(double lanes_top, StreamClass stream) {
  return lanes_top + static_cast<double>(stream) * (kLaneHeight + kLaneGap);
}

void draw_op(SvgWriter& svg, const Panel& p, const OpLookup& lookup, const PlanBlock& block,
             double block_start_us, const PlanOpTiming& t, double lanes_top) {
  const PlanOp& op = lookup.at(t.op);
  const bool forward = t.strand == Pass::kForward;
  const bool compute = op.stream == StreamClass::kCompute;
  const double y = lane_y(lanes_top, op.stream) + 2;
  const double h = kLaneHeight - 4;
  const double x0 = p.x(block_start_us + t.start_us);
  const double width = std::max(0.8, p.x(block_start_us + t.finish_us) - x0);
  const std::string title =
      fmt::format("{} ({}): {} - {} in the block, {}", t.op, stream_class_name(op.stream),
                  format_time_us(t.start_us), format_time_us(t.finish_us),
                  format_time_us(t.finish_us - t.start_us));
  const std::string fill = compute   ? (forward ? kForwardFill : kBackwardFill)
                           : forward ? "url(#hidden-fwd)"
                                     : "url(#hidden-bwd)";
  svg.rect(x0, y, width, h, {{"fill", fill}, {"stroke", "white"}, {"stroke-width", "0.5"}}, title);
  if (!compute) {
    for (const Interval& e :
         uncovered({t.start_us, t.finish_us}, compute_intervals(lookup, block))) {
      const double ex = p.x(block_start_us + e.from_us);
      const double ew = std::max(0.8, p.x(block_start_us + e.to_us) - ex);
      svg.rect(ex, y, ew, h, {{"fill", kExposedFill}},
               fmt::format("{} exposed for {}", t.op, format_time_us(e.to_us - e.from_us)));
      const std::string label = format_time_us(e.to_us - e.from_us);
      if (text_width_estimate(label, 9) + 2 <= ew) {
        svg.text(ex + ew / 2, y + h - 4, label, 9, {{"fill", "white"}, {"text-anchor", "middle"}});
      }
    }
  }
  // The op's name, smaller or without its "gemm_" prefix where the box is narrow; the
  // hover title names every op.
  const std::string name = short_name(t.op);
  const std::string bare = name.starts_with("gemm_") ? name.substr(5) : name;
  for (const auto& [label, size] : {std::pair{name, kOpLabelSize}, std::pair{name, kSmallLabelSize},
                                    std::pair{bare, kSmallLabelSize}}) {
    if (text_width_estimate(label, size) + 4 <= width) {
      svg.text(x0 + width / 2, y + h / 2 + (compute ? 4 : -2), label, size,
               {{"fill", compute ? "white" : "#111"}, {"text-anchor", "middle"}});
      break;
    }
  }
}

// A run of adjacent blocks each narrower than kSliverPx is labelled as one group ("b2-b5"),
// with its barriers drawn at the run's two edges only: barriers a pixel apart read as one
// thick line, and a label per block would not fit. A hover box over the run lists each block
// and its ops.
constexpr double kSliverPx = 10;

struct BlockGroup {
  size_t first = 0;
  size_t last = 0;  // inclusive
  bool sliver = false;
};

std::vector<BlockGroup> block_groups(const Panel& p) {
  std::vector<BlockGroup> out;
  for (size_t i = 0; i < p.blocks->size(); ++i) {
    const bool sliver = (*p.blocks)[i].time_us * p.scale < kSliverPx;
    if (sliver && !out.empty() && out.back().sliver && out.back().last + 1 == i) {
      out.back().last = i;
    } else {
      out.push_back({i, i, sliver});
    }
  }
  return out;
}

std::string group_name(const BlockGroup& g) {
  return g.first == g.last ? fmt::format("b{}", g.first) : fmt::format("b{}-b{}", g.first, g.last);
}

// The hover text of a sliver run: every block with its time and ops.
std::string group_title(const Panel& p, const BlockGroup& g) {
  std::string out = fmt::format("{}: {} block{} narrower than the picture can show apart",
                                group_name(g), g.last - g.first + 1, g.first == g.last ? "" : "s");
  for (size_t i = g.first; i <= g.last; ++i) {
    const PlanBlock& block = (*p.blocks)[i];
    std::string ops;
    for (const PlanOpTiming& t : block.timings) ops += (ops.empty() ? "" : ", ") + t.op;
    out += fmt::format("\nb{} ({}): {}", i, format_time_us(block.time_us), ops);
  }
  return out;
}

// Block names and times above the lanes, left to right; a label pushed right of the one
// before it when they would overlap (a sliver run's label is wider than the run).
void draw_block_labels(SvgWriter& svg, const Panel& p, const std::vector<BlockGroup>& groups,
                       const std::vector<double>& starts_us, double top) {
  double free_x = 0;
  for (const BlockGroup& g : groups) {
    const double a = p.x(starts_us[g.first]);
    const double b = p.x(starts_us[g.last + 1]);
    const std::string name = group_name(g);
    const std::string time = format_time_us(starts_us[g.last + 1] - starts_us[g.first]);
    const double width = std::max(text_width_estimate(name, 11), text_width_estimate(time, 10));
    if (!g.sliver && width + 4 > b - a) {
      // A normal block too narrow for its time: its name alone, or nothing (hover the ops).
      if (text_width_estimate(name, 10) + 2 <= b - a && (a + b) / 2 >= free_x) {
        svg.text((a + b) / 2, top + 12, name, 10, {{"fill", "#222"}, {"text-anchor", "middle"}});
        free_x = b;
      }
      continue;
    }
    const double centre = std::max((a + b) / 2, free_x + width / 2 + 3);
    svg.text(centre, top + 12, name, 11, {{"fill", "#222"}, {"text-anchor", "middle"}});
    svg.text(centre, top + 25, time, 10, {{"fill", "#555"}, {"text-anchor", "middle"}});
    free_x = centre + width / 2 + 3;
  }
}

void draw_blocks(SvgWriter& svg, const Panel& p, const OpLookup& lookup, double top) {
  const double lanes_top = top + kBlockRowHeight;
  const double lanes_bottom = lanes_top + 3 * (kLaneHeight + kLaneGap) - kLaneGap;
  for (StreamClass stream : kStreamClassNames.values()) {
    const double y = lane_y(lanes_top, stream);
    svg.rect(kLeft, y, kPlotWidth, kLaneHeight, {{"fill", "#f4f4f4"}});
    svg.text(kLeft - 8, y + kLaneHeight / 2 + 4, stream_title(stream), 12,
             {{"fill", "#222"}, {"text-anchor", "end"}});
  }
  std::vector<double> starts_us = {0};
  for (const PlanBlock& block : *p.blocks) starts_us.push_back(starts_us.back() + block.time_us);
  const std::vector<BlockGroup> groups = block_groups(p);
  draw_block_labels(svg, p, groups, starts_us, top);
  for (size_t i = 0; i < p.blocks->size(); ++i) {
    for (const PlanOpTiming& timing : (*p.blocks)[i].timings) {
      draw_op(svg, p, lookup, (*p.blocks)[i], starts_us[i], timing, lanes_top);
    }
  }
  // Barriers and hover boxes last, so that they stay visible and reachable over the ops.
  for (const BlockGroup& g : groups) {
    const double a = p.x(starts_us[g.first]);
    const double b = p.x(starts_us[g.last + 1]);
    if (g.sliver) {
      const double w = std::max(6.0, b - a);
      svg.rect(
          (a + b - w) / 2, top + 2, w, lanes_bottom - top,
          {{"fill", "white"}, {"fill-opacity", "0"}, {"stroke", "#333"}, {"stroke-width", "0.5"}},
          group_title(p, g));
    }
    svg.line(a, top + 2, a, lanes_bottom + 2,
             {{"stroke", "#333"}, {"stroke-width", "1"}, {"stroke-dasharray", "4,3"}});
  }
  const double end = p.x(starts_us.back());
  svg.line(end, top + 2, end, lanes_bottom + 2,
           {{"stroke", "#333"}, {"stroke-width", "1"}, {"stroke-dasharray", "4,3"}});
}

void draw_axis(SvgWriter& svg, const Panel& p, double y, double total_us) {
  svg.line(kLeft, y, kLeft + kPlotWidth, y, {{"stroke", "#444"}});
  const double step = nice_tick_step(total_us, 12);
  for (double t = 0; t <= total_us + 1e-9; t += step) {
    svg.line(p.x(t), y, p.x(t), y + 5, {{"stroke", "#444"}});
    svg.text(p.x(t), y + 17, format_time_us(t), 10, {{"fill", "#333"}, {"text-anchor", "middle"}});
  }
}

std::string overlap_line(const CommOverlap& o) {
  std::string under;
  for (size_t i = 0; i < o.hidden_under.size() && i < 3; ++i) {
    under += (i == 0 ? "" : ", ") + short_name(o.hidden_under[i]);
  }
  if (o.hidden_under.size() > 3) under += fmt::format(" +{} more", o.hidden_under.size() - 3);
  return fmt::format("{} {} (b{}, {}): {}", o.strand == Pass::kForward ? "F" : "B",
                     short_name(o.op), o.block, format_time_us(o.time_us),
                     under.empty() ? "under no computation" : "under " + under);
}

void draw_captions(SvgWriter& svg, const Panel& p, const std::vector<CommOverlap>& overlaps,
                   double y) {
  const double total_us = blocks_time_us(*p.blocks);
  double comm_us = 0;
  double exposed_us = 0;
  for (const CommOverlap& o : overlaps) {
    comm_us += o.time_us;
    exposed_us += o.exposed_us;
  }
  std::string times;
  for (const PlanBlock& b : *p.blocks) {
    times += (times.empty() ? "" : " + ") + format_time_us(b.time_us);
  }
  std::string line =
      fmt::format("{} blocks: {} = {}", p.blocks->size(), times, format_time_us(total_us));
  std::string versus;
  if (p.sequential_us > 0) {
    versus = fmt::format("; strands one after the other: {} (saves {:.1f} %)",
                         format_time_us(p.sequential_us), 100 * (1 - total_us / p.sequential_us));
  }
  if (text_width_estimate(line + versus, 12) > kWidth - kLeft - kRight) {
    line = fmt::format("{} blocks, {} in all", p.blocks->size(), format_time_us(total_us));
  }
  line += versus;
  svg.text(kLeft, y, line, 12, {{"fill", "#222"}});
  svg.text(kLeft, y + kCaptionLine,
           fmt::format("communication {}: hidden {}, exposed {}", format_time_us(comm_us),
                       format_time_us(comm_us - exposed_us), format_time_us(exposed_us)),
           12, {{"fill", exposed_us > 0 ? kExposedFill : "#222"}});
  if (!p.table) return;
  const double table_y = y + 2 * kCaptionLine;
  svg.text(kLeft, table_y, "which computation each communication op hides under:", 12,
           {{"fill", "#222"}, {"font-weight", "bold"}});
  const int64_t rows = table_rows(overlaps);
  for (size_t i = 0; i < overlaps.size(); ++i) {
    const CommOverlap& o = overlaps[i];
    const double col_x = kLeft + (static_cast<int64_t>(i) < rows ? 0 : kPlotWidth / 2);
    const double row_y =
        table_y + kTableLine * static_cast<double>(1 + static_cast<int64_t>(i) % rows);
    std::string text = overlap_line(o);
    if (o.exposed_us > 0) text += fmt::format("; exposed {}", format_time_us(o.exposed_us));
    svg.text(col_x, row_y, text, 11, {{"fill", o.exposed_us > 0 ? kExposedFill : "#222"}});
  }
}

double draw_panel(SvgWriter& svg, const PlanPairing& pairing, Panel p, double y) {
  const OpLookup lookup(pairing);
  const double total_us = blocks_time_us(*p.blocks);
  p.scale = total_us > 0 ? kPlotWidth / total_us : 1;
  const std::vector<CommOverlap> overlaps = comm_overlaps(pairing, *p.blocks);
  svg.text(kLeft, y + 16, p.title, 13, {{"fill", "#222"}, {"font-weight", "bold"}});
  const double top = y + kPanelTitleHeight;
  draw_blocks(svg, p, lookup, top);
  const double axis_y = top + kBlockRowHeight + 3 * (kLaneHeight + kLaneGap) - kLaneGap + 4;
  draw_axis(svg, p, axis_y, total_us);
  draw_captions(svg, p, overlaps, axis_y + kAxisHeight + 4);
  return y + panel_height(p, overlaps) + kPanelGap;
}

std::string hatch(const char* id, const char* light, const char* dark) {
  return fmt::format(
      "<pattern id=\"{}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"{}\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"{}\" stroke-width=\"2.5\"/></pattern>",
      id, light, dark);
}

void legend(SvgWriter& svg, double y) {
  double x = kLeft;
  const auto item = [&](const std::string& fill, const std::string& label) {
    svg.rect(x, y - 11, 14, 14, {{"fill", fill}, {"stroke", "#888"}, {"stroke-width", "0.5"}});
    svg.text(x + 20, y, label, 12, {{"fill", "#222"}});
    x += 20 + 0.9 * text_width_estimate(label, 12) + 18;
  };
  item(kForwardFill, "forward compute");
  item(kBackwardFill, "backward compute");
  item("url(#hidden-fwd)", "forward comm, hidden");
  item("url(#hidden-bwd)", "backward comm, hidden");
  item(kExposedFill, "exposed comm");
  svg.line(x, y - 12, x, y + 4, {{"stroke", "#333"}, {"stroke-dasharray", "4,3"}});
  svg.text(x + 8, y, "barrier (block end)", 12, {{"fill", "#222"}});
}

std::vector<Panel> panels(const PlanPairing& pairing) {
  const double per_layer_sequential_us =
      pairing.chunk_layers > 0 ? pairing.sequential_us / static_cast<double>(pairing.chunk_layers)
                               : 0;
  std::vector<Panel> out;
  out.push_back({&pairing.layer_blocks,
                 "layer scope: one layer's forward (micro-batch j) with one layer's backward "
                 "(micro-batch j - pp)",
                 per_layer_sequential_us, true, 1});
  if (pairing.window_layers > 1 && !pairing.window_blocks.empty()) {
    out.push_back({&pairing.window_blocks,
                   fmt::format("cross-layer window of {} layers ({} scope used by the stages)",
                               pairing.window_layers,
                               pairing.scope == PairingScope::kChunk ? "this" : "the layer"),
                   per_layer_sequential_us * static_cast<double>(pairing.window_layers), false, 1});
  }
  return out;
}

}  // namespace

std::vector<CommOverlap> comm_overlaps(const PlanPairing& pairing,
                                       const std::vector<PlanBlock>& blocks) {
  const OpLookup lookup(pairing);
  std::vector<CommOverlap> out;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const PlanBlock& block = blocks[b];
    const std::vector<Interval> compute = compute_intervals(lookup, block);
    for (const PlanOpTiming& t : block.timings) {
      if (lookup.at(t.op).stream == StreamClass::kCompute) continue;
      CommOverlap o{.op = t.op,
                    .strand = t.strand,
                    .block = static_cast<int64_t>(b),
                    .time_us = t.finish_us - t.start_us,
                    .exposed_us = 0,
                    .hidden_under = {}};
      for (const Interval& e : uncovered({t.start_us, t.finish_us}, compute)) {
        o.exposed_us += e.to_us - e.from_us;
      }
      for (const PlanOpTiming& c : block.timings) {
        if (lookup.at(c.op).stream != StreamClass::kCompute) continue;
        if (std::min(c.finish_us, t.finish_us) > std::max(c.start_us, t.start_us)) {
          o.hidden_under.push_back(c.op);
        }
      }
      out.push_back(std::move(o));
    }
  }
  return out;
}

std::string pairing_svg(const Plan& plan, int64_t pairing_index) {
  if (pairing_index < 0 || pairing_index >= static_cast<int64_t>(plan.pairings.size())) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: pairing {} does not exist ({} pairings)", pairing_index,
                            plan.pairings.size()));
  }
  const PlanPairing& pairing = plan.pairings[static_cast<size_t>(pairing_index)];
  const std::vector<Panel> list = panels(pairing);
  double height = kHeaderHeight;
  for (const Panel& p : list) {
    height += panel_height(p, comm_overlaps(pairing, *p.blocks)) + kPanelGap;
  }
  SvgWriter svg(kWidth, height);
  svg.add_defs(hatch("hidden-fwd", "#dbe5f1", kForwardFill));
  svg.add_defs(hatch("hidden-bwd", "#fde3c8", kBackwardFill));
  std::string stages;
  for (const PlanStage& s : plan.stages) {
    if (s.pairing == pairing_index)
      stages += (stages.empty() ? "" : ", ") + std::to_string(s.stage);
  }
  svg.text(
      kLeft, 26,
      fmt::format("{}: strand interleaving of one layer pair (pairing {}, stage{} {})",
                  plan.job.name, pairing_index, stages.find(',') == std::string::npos ? "" : "s",
                  stages.empty() ? "none" : stages),
      15, {{"fill", "#111"}, {"font-weight", "bold"}});
  legend(svg, 54);
  double y = kHeaderHeight;
  for (const Panel& p : list) y = draw_panel(svg, pairing, p, y);
  return svg.finish();
}

}  // namespace dhelix
