#include "emitter/plan_report.h"

#include <fmt/format.h>

namespace dhelix {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double exposed_us(const PlanScheme& s) {
  double total = 0;
  for (const PlanCommTime& c : s.comm) total += c.exposed_us;
  return total;
}

std::string seconds(double us) { return fmt::format("{:.3f} s", us * 1e-6); }
std::string millis(double us) { return fmt::format("{:.1f} ms", us * 1e-3); }

std::string comparison_table(const Plan& plan) {
  std::string out =
      fmt::format("{:<15} {:>11} {:>11} {:>7} {:>7} {:>13} {:>9} {:>5}\n", "scheme", "iteration",
                  "TFLOPS/GPU", "MFU", "bubble", "exposed comm", "speed-up", "fits");
  for (const PlanScheme& s : plan.schemes) {
    out += fmt::format("{:<15} {:>11} {:>11.1f} {:>6.1f}% {:>6.1f}% {:>13} {:>8.2f}x {:>5}\n",
                       s.scheme, seconds(s.iteration_us), s.tflops_per_gpu, 100 * s.mfu,
                       100 * s.bubble_ratio, millis(exposed_us(s)), s.speedup_vs_megatron,
                       s.fits ? "yes" : "NO");
  }
  return out;
}

std::string exposed_by_type(const Plan& plan) {
  std::string out = "communication per GPU and iteration, hidden / exposed:\n";
  for (const PlanScheme& s : plan.schemes) {
    std::string parts;
    for (const PlanCommTime& c : s.comm) {
      if (c.hidden_us == 0 && c.exposed_us == 0) continue;
      parts += fmt::format("  {} {} / {}", c.type, millis(c.hidden_us), millis(c.exposed_us));
    }
    out += fmt::format("  {:<15}{}\n", s.scheme, parts.empty() ? "  none" : parts);
  }
  return out;
}

std::string scopes(const Plan& plan) {
  std::string out;
  for (size_t i = 0; i < plan.pairings.size(); ++i) {
    const PlanPairing& p = plan.pairings[i];
    std::string stages;
    for (const PlanStage& s : plan.stages) {
      if (s.pairing == static_cast<int64_t>(i))
        stages += fmt::format("{}{}", stages.empty() ? "" : ",", s.stage);
    }
    out += fmt::format(
        "pairing {} (stages {}): scope {}; SI block of {} layers: layer scope {}, chunk scope "
        "({}-layer windows) {}, strands one after the other {}\n",
        i, stages, p.scope, p.chunk_layers, millis(p.layer_scope_us), p.window_layers,
        millis(p.chunk_scope_us), millis(p.sequential_us));
  }
  return out;
}

std::string memory(const Plan& plan) {
  const PlanScheme* dhelix = plan.find_scheme("dhelix");
  if (dhelix == nullptr) return "";
  std::string out = fmt::format("dhelix memory per GPU ({:.2f} GiB usable on {}):\n",
                                plan.memory_budget.usable_bytes / kGiB, plan.memory_budget.gpu);
  for (const PlanStageMemory& m : dhelix->memory) {
    out += fmt::format(
        "  stage {}: {:.2f} GiB = weights {:.2f} + gradients {:.2f} + optimizer {:.2f} + "
        "activations {:.2f}\n",
        m.stage, m.total_bytes / kGiB, m.weight_bytes / kGiB, m.gradient_bytes / kGiB,
        m.optimizer_bytes / kGiB, m.activation_bytes / kGiB);
  }
  return out;
}

}  // namespace

std::string plan_report_text(const Plan& plan) {
  int64_t gpus = 0;
  for (const PlanStage& s : plan.stages) gpus += static_cast<int64_t>(s.ranks.size());
  std::string out = fmt::format("{}: {} micro-batches, {} stage{}, {} GPUs ({})\n", plan.job.name,
                                plan.num_micro_batches, plan.stages.size(),
                                plan.stages.size() == 1 ? "" : "s", gpus, plan.memory_budget.gpu);
  out += comparison_table(plan);
  out += exposed_by_type(plan);
  out += scopes(plan);
  out += memory(plan);
  return out;
}

}  // namespace dhelix
