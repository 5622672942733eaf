#include "emitter/svg_schemes.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "emitter/svg_writer.h"
#include "lib/error.h"

namespace dhelix {
namespace {

constexpr double kWidth = 1200;
constexpr double kLeft = 150;  // scheme and stage names
constexpr double kRight = 20;
constexpr double kRowHeight = 14;
constexpr double kPanelGap = 26;  // title line above each panel
constexpr double kTop = 40;
constexpr double kAxisHeight = 30;
constexpr double kLegendHeight = 30;

const char* box_fill(TimelineBoxKind kind) {
  switch (kind) {
    case TimelineBoxKind::kForward:
      return kForwardFill;
    case TimelineBoxKind::kBackward:
      return kBackwardFill;
    case TimelineBoxKind::kInputGradient:
      return "#ffbe7d";
    case TimelineBoxKind::kWeightGradient:
      return "#9c6b30";
    case TimelineBoxKind::kSiBlock:
      return "#8c6bb1";
    case TimelineBoxKind::kHeadLoss:
      return "#999999";
  }
  return "#000000";
}

struct Scale {
  double end_us = 1;
  double x(double time_us) const { return kLeft + (kWidth - kLeft - kRight) * time_us / end_us; }
};

// Boxes narrower than kMinBoxWidth that follow each other without a visible gap are drawn
// as one grey-violet run, so that a picture of thousands of tasks stays a few thousand
// shapes; the gaps (the bubbles) stay visible.
constexpr double kMinBoxWidth = 3;
constexpr double kVisibleGap = 0.5;
constexpr const char* kRunFill = "#7b7fa8";

// One past the last box of the run starting at `first` (first + 1: the box stands alone).
size_t run_end(const std::vector<TimelineBox>& boxes, size_t first, const Scale& scale) {
  const auto narrow = [&](const TimelineBox& b) {
    return scale.x(b.end_us) - scale.x(b.start_us) < kMinBoxWidth;
  };
  size_t end = first + 1;
  while (end < boxes.size() && narrow(boxes[end - 1]) && narrow(boxes[end]) &&
         scale.x(boxes[end].start_us) - scale.x(boxes[end - 1].end_us) < kVisibleGap) {
    end += 1;
  }
  return end;
}

void draw_box(SvgWriter& svg, const TimelineBox& box, const Scale& scale, double row) {
  const double x0 = scale.x(box.start_us);
  const double width = std::max(0.5, scale.x(box.end_us) - x0);
  svg.rect(x0, row, width, kRowHeight - 1,
           {{"fill", box_fill(box.kind)}, {"stroke", "white"}, {"stroke-width", "0.4"}}, box.label);
  if (text_width_estimate(box.label, 8) + 2 < width) {
    svg.text(x0 + width / 2, row + kRowHeight - 4, box.label, 8,
             {{"fill", "white"}, {"text-anchor", "middle"}});
  }
}

void draw_run(SvgWriter& svg, const std::vector<TimelineBox>& boxes, size_t first, size_t end,
              const Scale& scale, double row) {
  const double x0 = scale.x(boxes[first].start_us);
  const double width = std::max(0.5, scale.x(boxes[end - 1].end_us) - x0);
  svg.rect(
      x0, row, width, kRowHeight - 1, {{"fill", kRunFill}},
      fmt::format("{} tasks, {} .. {}", end - first, boxes[first].label, boxes[end - 1].label));
}

void draw_panel(SvgWriter& svg, const SchemeTimeline& t, const Scale& scale, double y) {
  svg.text(8, y - 8,
           fmt::format("{}: {}, bubble {:.1f} %", pipeline_scheme_name(t.scheme),
                       format_time_us(t.iteration_us), 100 * t.bubble_ratio),
           12, {{"fill", "#222"}, {"font-weight", "bold"}});
  for (size_t s = 0; s < t.stages.size(); ++s) {
    const double row = y + static_cast<double>(s) * kRowHeight;
    svg.text(kLeft - 6, row + kRowHeight - 3, fmt::format("stage {}", s), 10,
             {{"fill", "#555"}, {"text-anchor", "end"}});
    svg.rect(kLeft, row, kWidth - kLeft - kRight, kRowHeight - 1, {{"fill", "#f4f4f4"}});
    const std::vector<TimelineBox>& boxes = t.stages[s];
    for (size_t i = 0; i < boxes.size();) {
      const size_t end = run_end(boxes, i, scale);
      if (end > i + 1) {
        draw_run(svg, boxes, i, end, scale, row);
      } else {
        draw_box(svg, boxes[i], scale, row);
      }
      i = end;
    }
  }
  const double end_x = scale.x(t.iteration_us);
  svg.line(end_x, y - 4, end_x, y + static_cast<double>(t.stages.size()) * kRowHeight + 2,
           {{"stroke", "#7a3b00"}, {"stroke-dasharray", "3,2"}});
}

void draw_axis(SvgWriter& svg, const Scale& scale, double y) {
  const double step = nice_tick_step(scale.end_us, 8);
  for (double t = 0; t <= scale.end_us + 1e-9; t += step) {
    svg.line(scale.x(t), y, scale.x(t), y + 4, {{"stroke", "#333"}});
    svg.text(scale.x(t), y + 16, format_time_us(t), 10,
             {{"fill", "#333"}, {"text-anchor", "middle"}});
  }
}

void draw_legend(SvgWriter& svg, double y) {
  double x = kLeft;
  const std::pair<TimelineBoxKind, const char*> items[] = {
      {TimelineBoxKind::kForward, "forward"},
      {TimelineBoxKind::kBackward, "backward"},
      {TimelineBoxKind::kInputGradient, "input gradient (I)"},
      {TimelineBoxKind::kWeightGradient, "weight gradient (W)"},
      {TimelineBoxKind::kSiBlock, "forward and backward co-run"},
      {TimelineBoxKind::kHeadLoss, "head and loss"}};
  const auto swatch = [&](const char* fill, const char* label) {
    svg.rect(x, y - 11, 14, 14, {{"fill", fill}, {"stroke", "#888"}, {"stroke-width", "0.5"}});
    svg.text(x + 20, y, label, 12, {{"fill", "#222"}});
    x += 30 + text_width_estimate(label, 12);
  };
  for (const auto& [kind, label] : items) swatch(box_fill(kind), label);
  swatch(kRunFill, "tasks too short to draw apart");
}

}  // namespace

std::string schemes_svg(const std::vector<SchemeTimeline>& timelines, const std::string& title) {
  DHELIX_CHECK(!timelines.empty());
  Scale scale;
  double height = kTop + kAxisHeight + kLegendHeight;
  for (const SchemeTimeline& t : timelines) {
    DHELIX_CHECK(!t.stages.empty());
    scale.end_us = std::max(scale.end_us, t.iteration_us);
    height += kPanelGap + static_cast<double>(t.stages.size()) * kRowHeight;
  }
  SvgWriter svg(kWidth, height);
  svg.text(8, 20, title, 14, {{"fill", "#222"}, {"font-weight", "bold"}});
  double y = kTop;
  for (const SchemeTimeline& t : timelines) {
    y += kPanelGap;
    draw_panel(svg, t, scale, y);
    y += static_cast<double>(t.stages.size()) * kRowHeight;
  }
  draw_axis(svg, scale, y + 4);
  draw_legend(svg, y + kAxisHeight + 18);
  return svg.finish();
}

}  // namespace dhelix
