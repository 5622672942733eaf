#include "emitter/svg_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "emitter/svg_writer.h"

namespace dhelix {
namespace {

constexpr double kWidth = 1400;
constexpr double kLeft = 84;  // stage labels
constexpr double kRight = 24;
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kRowHeight = 34;
constexpr double kRowGap = 6;
constexpr double kPanelTitleHeight = 26;
constexpr double kAxisHeight = 34;
constexpr double kPanelGap = 14;
constexpr double kHeaderHeight = 84;
constexpr double kLabelSize = 11;

// Colours besides the strand colours (svg_writer.h).
constexpr const char* kSiFill = "#8c6bb1";
constexpr const char* kHeadLossFill = "#59a14f";
constexpr const char* kWarmUpTint = "#e3ecf7";
constexpr const char* kSteadyTint = "#eee6f6";
constexpr const char* kCoolDownTint = "#fbe8d6";

const char* task_fill(TaskKind kind) {
  switch (kind) {
    case TaskKind::kForward:
      return kForwardFill;
    case TaskKind::kBackward:
      return kBackwardFill;
    case TaskKind::kHeadLoss:
      return kHeadLossFill;
    case TaskKind::kSiBlock:
      break;
  }
  return kSiFill;
}

// A time window of the iteration drawn as one panel.
struct Window {
  double from_us = 0;
  double to_us = 0;
  std::string title;
  double x(double time_us) const {
    return kLeft + (time_us - from_us) / (to_us - from_us) * kPlotWidth;
  }
};

// Where a stage's steady phase (its SI blocks) begins and ends. Without SI blocks the steady
// phase is empty, at the first task with a backward pass.
struct Regions {
  double steady_from_us = 0;
  double steady_to_us = 0;
  double end_us = 0;
};

Regions stage_regions(const PlanStage& stage) {
  Regions r;
  if (stage.tasks.empty()) return r;
  r.end_us = stage.tasks.back().end_us;
  auto first = std::find_if(stage.tasks.begin(), stage.tasks.end(),
                            [](const PlanTask& t) { return t.kind == TaskKind::kSiBlock; });
  if (first == stage.tasks.end()) {
    auto backward = std::find_if(stage.tasks.begin(), stage.tasks.end(),
                                 [](const PlanTask& t) { return t.backward.has_value(); });
    r.steady_from_us = r.steady_to_us =
        backward == stage.tasks.end() ? r.end_us : backward->start_us;
    return r;
  }
  auto last = std::find_if(stage.tasks.rbegin(), stage.tasks.rend(),
                           [](const PlanTask& t) { return t.kind == TaskKind::kSiBlock; });
  r.steady_from_us = first->start_us;
  r.steady_to_us = last->end_us;
  return r;
}

double plan_end_us(const Plan& plan) {
  double end_us = 0;
  for (const PlanStage& stage : plan.stages) {
    if (!stage.tasks.empty()) end_us = std::max(end_us, stage.tasks.back().end_us);
  }
  if (const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix)) {
    end_us = std::max(end_us, dhelix->iteration_us);
  }
  return end_us > 0 ? end_us : 1;
}

int64_t first_si_index(const PlanStage& stage) {
  for (const PlanTask& t : stage.tasks) {
    if (t.kind == TaskKind::kSiBlock) return t.index;
  }
  return 0;
}

int64_t last_si_index(const PlanStage& stage) {
  for (auto it = stage.tasks.rbegin(); it != stage.tasks.rend(); ++it) {
    if (it->kind == TaskKind::kSiBlock) return it->index;
  }
  return static_cast<int64_t>(stage.tasks.size()) - 1;
}

// The whole iteration, and for long plans the start and the end: each stage's phase change
// and 2·pp + 2 tasks of steady state beside it.
std::vector<Window> windows(const Plan& plan) {
  const double end_us = plan_end_us(plan);
  std::vector<Window> out = {{0, end_us, "whole iteration"}};
  int64_t most_tasks = 0;
  for (const PlanStage& s : plan.stages) {
    most_tasks = std::max(most_tasks, static_cast<int64_t>(s.tasks.size()));
  }
  if (most_tasks <= kPipelineZoomTasks) return out;
  const int64_t steady_tasks = 2 * static_cast<int64_t>(plan.stages.size()) + 2;
  double start_to_us = 0;
  double end_from_us = end_us;
  for (const PlanStage& s : plan.stages) {
    if (s.tasks.empty()) continue;
    const int64_t n = static_cast<int64_t>(s.tasks.size());
    const int64_t a = std::min(n - 1, first_si_index(s) + steady_tasks - 1);
    const int64_t b = std::max<int64_t>(0, last_si_index(s) - steady_tasks + 1);
    start_to_us = std::max(start_to_us, s.tasks[static_cast<size_t>(a)].end_us);
    end_from_us = std::min(end_from_us, s.tasks[static_cast<size_t>(b)].start_us);
  }
  out.push_back({0, start_to_us, "start: warm-up into steady state (zoomed)"});
  out.push_back({end_from_us, end_us, "end: steady state into cool-down (zoomed)"});
  return out;
}

double panel_height(const Plan& plan) {
  return kPanelTitleHeight + static_cast<double>(plan.stages.size()) * (kRowHeight + kRowGap) +
         kAxisHeight;
}

// A rectangle clipped to the window; nothing when outside it.
void clipped_rect(SvgWriter& svg, const Window& w, double from_us, double to_us, double y,
                  double height, const SvgAttributes& attributes, const std::string& title = "") {
  const double a = std::max(from_us, w.from_us);
  const double b = std::min(to_us, w.to_us);
  if (b <= a) return;
  svg.rect(w.x(a), y, std::max(0.6, w.x(b) - w.x(a)), height, attributes, title);
}

void draw_regions(SvgWriter& svg, const Window& w, const PlanStage& stage, double y) {
  const Regions r = stage_regions(stage);
  clipped_rect(svg, w, w.from_us, r.steady_from_us, y, kRowHeight, {{"fill", kWarmUpTint}});
  clipped_rect(svg, w, r.steady_from_us, r.steady_to_us, y, kRowHeight, {{"fill", kSteadyTint}});
  clipped_rect(svg, w, r.steady_to_us, std::max(r.end_us, w.to_us), y, kRowHeight,
               {{"fill", kCoolDownTint}});
}

std::string task_title(const PlanTask& task) {
  return fmt::format("{} ({}): {} to {}, {}", task.label, task_kind_name(task.kind),
                     format_time_us(task.start_us), format_time_us(task.end_us),
                     format_time_us(task.end_us - task.start_us));
}

void draw_tasks(SvgWriter& svg, const Window& w, const PlanStage& stage, double y) {
  const double box_y = y + 3;
  const double box_height = kRowHeight - 6;
  for (const PlanTask& task : stage.tasks) {
    if (task.end_us <= w.from_us || task.start_us >= w.to_us) continue;
    clipped_rect(svg, w, task.start_us, task.end_us, box_y, box_height,
                 {{"fill", task_fill(task.kind)}, {"stroke", "white"}, {"stroke-width", "0.6"}},
                 task_title(task));
    const double a = w.x(std::max(task.start_us, w.from_us));
    const double b = w.x(std::min(task.end_us, w.to_us));
    if (text_width_estimate(task.label, kLabelSize) + 4 <= b - a) {
      svg.text((a + b) / 2, box_y + box_height / 2 + kLabelSize * 0.36, task.label, kLabelSize,
               {{"fill", "white"}, {"text-anchor", "middle"}});
    }
  }
}

void draw_axis(SvgWriter& svg, const Window& w, double y) {
  svg.line(kLeft, y, kLeft + kPlotWidth, y, {{"stroke", "#444"}, {"stroke-width", "1"}});
  const double step = nice_tick_step(w.to_us - w.from_us, 10);
  for (double t = std::ceil(w.from_us / step) * step; t <= w.to_us + 1e-9; t += step) {
    const double x = w.x(t);
    svg.line(x, y, x, y + 5, {{"stroke", "#444"}});
    svg.text(x, y + 17, format_time_us(t), 10, {{"fill", "#333"}, {"text-anchor", "middle"}});
  }
}

// The dashed iteration end, and the time between the last task and it (the gradient reduction
// over data-parallel replicas and the optimizer step, which the task lists leave out).
void draw_iteration_end(SvgWriter& svg, const Plan& plan, const Window& w, double iteration_us,
                        double rows_top, double rows_bottom) {
  if (iteration_us <= w.from_us || iteration_us > w.to_us) return;
  const double x = w.x(iteration_us);
  svg.line(x, rows_top - 4, x, rows_bottom + 2,
           {{"stroke", "#c00"}, {"stroke-width", "1.5"}, {"stroke-dasharray", "5,3"}});
  double last_task_us = 0;
  for (const PlanStage& stage : plan.stages) {
    if (!stage.tasks.empty()) last_task_us = std::max(last_task_us, stage.tasks.back().end_us);
  }
  const double a = w.x(std::max(last_task_us, w.from_us));
  const std::string label = fmt::format("gradient reduction + optimizer step: {}",
                                        format_time_us(iteration_us - last_task_us));
  if (text_width_estimate(label, kLabelSize) + 8 <= x - a) {
    svg.text((a + x) / 2, rows_top + kRowHeight / 2 + 4, label, kLabelSize,
             {{"fill", "#7a3b00"}, {"text-anchor", "middle"}});
  }
}

double draw_panel(SvgWriter& svg, const Plan& plan, const Window& w, double y) {
  svg.text(kLeft, y + 17, w.title, 13, {{"fill", "#222"}, {"font-weight", "bold"}});
  double row_y = y + kPanelTitleHeight;
  for (const PlanStage& stage : plan.stages) {
    svg.text(kLeft - 10, row_y + kRowHeight / 2 + 4, fmt::format("stage {}", stage.stage), 12,
             {{"fill", "#222"}, {"text-anchor", "end"}});
    draw_regions(svg, w, stage, row_y);
    draw_tasks(svg, w, stage, row_y);
    row_y += kRowHeight + kRowGap;
  }
  if (const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix)) {
    draw_iteration_end(svg, plan, w, dhelix->iteration_us, y + kPanelTitleHeight, row_y - kRowGap);
  }
  draw_axis(svg, w, row_y - kRowGap + 4);
  return y + panel_height(plan) + kPanelGap;
}

void legend_swatch(SvgWriter& svg, double& x, double y, const char* fill, const std::string& label,
                   bool dashed = false) {
  if (dashed) {
    svg.line(x + 7, y - 11, x + 7, y + 3,
             {{"stroke", "#c00"}, {"stroke-width", "1.5"}, {"stroke-dasharray", "4,2"}});
  } else {
    svg.rect(x, y - 11, 14, 14, {{"fill", fill}, {"stroke", "#888"}, {"stroke-width", "0.5"}});
  }
  svg.text(x + 20, y, label, 12, {{"fill", "#222"}});
  x += 20 + 1.1 * text_width_estimate(label, 12) + 16;
}

void draw_header(SvgWriter& svg, const Plan& plan) {
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  const PlanScheme* megatron = plan.find_scheme(PipelineScheme::kMegatron1F1B);
  const bool v = dhelix != nullptr && dhelix->shape == PipelineShape::kV;
  std::string title = fmt::format("{}: {}-shaped pipeline, {} stage{}, {} micro-batches",
                                  plan.job.name, v ? "V" : "W", plan.stages.size(),
                                  plan.stages.size() == 1 ? "" : "s", plan.num_micro_batches);
  if (dhelix != nullptr) {
    title += fmt::format(", predicted iteration {}", format_time_us(dhelix->iteration_us));
    if (megatron != nullptr && dhelix->speedup_vs_megatron > 0) {
      title += fmt::format(", {:.2f}x Megatron 1F1B", dhelix->speedup_vs_megatron);
    }
  }
  svg.text(kLeft, 26, title, 15, {{"fill", "#111"}, {"font-weight", "bold"}});
  double x = kLeft;
  const double y = 52;
  legend_swatch(svg, x, y, kForwardFill, "forward F<mb><chunk>");
  legend_swatch(svg, x, y, kBackwardFill, "backward B<mb><chunk> (split: I input, W weight)");
  legend_swatch(svg, x, y, kSiFill, "SI block F+B interleaved");
  legend_swatch(svg, x, y, kHeadLossFill, "head + loss H<mb>");
  legend_swatch(svg, x, y, "", "iteration end", true);
  x = kLeft;
  legend_swatch(svg, x, y + 22, kWarmUpTint, "warm-up");
  legend_swatch(svg, x, y + 22, kSteadyTint, "steady (SI blocks)");
  legend_swatch(svg, x, y + 22, kCoolDownTint, "cool-down");
  svg.text(
      x, y + 22,
      fmt::format("chunk: d = down (first leg of the {0}), u = up (second leg)", v ? "V" : "W"), 12,
      {{"fill", "#555"}});
}

}  // namespace

std::string pipeline_svg(const Plan& plan) {
  const std::vector<Window> panels = windows(plan);
  const double height =
      kHeaderHeight + 10 + static_cast<double>(panels.size()) * (panel_height(plan) + kPanelGap);
  SvgWriter svg(kWidth, height);
  draw_header(svg, plan);
  double y = kHeaderHeight + 10;
  for (const Window& w : panels) y = draw_panel(svg, plan, w, y);
  return svg.finish();
}

}  // namespace dhelix
