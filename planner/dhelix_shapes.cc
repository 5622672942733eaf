#include "planner/dhelix_shapes.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "planner/baseline_schedules.h"
#include "planner/combined_1f1b.h"
#include "planner/w_split_drain.h"

namespace dhelix::plan_detail {
namespace {

struct Candidate {
  SchemeRun run;
  PlanShapeCandidate record;
};

int64_t peak_bytes(const std::vector<StageMemory>& memory) {
  int64_t peak = 0;
  for (const StageMemory& m : memory) peak = std::max(peak, m.total_bytes());
  return peak;
}

bool has_si_blocks(const PipelineSchedule& schedule) {
  for (int64_t p = 0; p < schedule.pp; ++p) {
    if (schedule.si_block_count(p) > 0) return true;
  }
  return false;
}

Candidate candidate(SchemeRun run, bool split, int64_t bound, const MemoryBudget& budget) {
  Candidate c;
  c.record = {.shape = run.schedule.shape,
              .split_backward = split,
              .max_deferred_weight_gradients = bound == kUnboundedDeferral ? -1 : bound,
              .si_blocks = has_si_blocks(run.schedule),
              .iteration_us = run.simulation.iteration_us,
              .bubble_ratio = run.simulation.bubble_ratio,
              .peak_bytes = peak_bytes(run.memory),
              .fits = fits(run.memory, budget)};
  c.run = std::move(run);
  return c;
}

// The W whole, then split under each bound on waiting weight gradients; a bound at or above
// a stage's lone backwards (2·min(m, pp)) is the unbounded one.
void add_w_candidates(const Context& ctx, const std::vector<StageCosts>& costs,
                      const std::vector<PlanStagePhases>& phases, const MemoryBudget& budget,
                      bool split_backward, std::vector<Candidate>& out) {
  const PipelineSchedule w = make_w_schedule(ctx.pp, ctx.micro_batches);
  out.push_back(
      candidate(run_schedule(ctx, PipelineScheme::kDHelix, w, costs, phases), false, 0, budget));
  if (!split_backward) return;
  const int64_t lone_backwards = 2 * std::min(ctx.micro_batches, ctx.pp);
  std::vector<int64_t> bounds = {0};
  for (int64_t b = 1; b < lone_backwards; b *= 2) bounds.push_back(b);
  bounds.push_back(kUnboundedDeferral);
  for (int64_t bound : bounds) {
    SchemeRun run =
        run_schedule(ctx, PipelineScheme::kDHelix, split_w_drain(w, costs, bound), costs, phases);
    out.push_back(candidate(std::move(run), true, bound, budget));
  }
}

// Megatron's interleaved stages (v model chunks each) with dhelix's costs: the combined 1F1B
// order, each step's forward and backward one SI block of the pairing search, then the plain
// interleaved order, where nothing is co-executed (megatron-interleaved's own run).
void add_interleaved_candidates(const Context& ctx, const ExtraCosts& extras,
                                const MemoryBudget& budget, std::vector<Candidate>& out) {
  std::vector<PlanStagePhases> phases;
  const std::vector<StageCosts> costs =
      stage_costs(ctx, PipelineScheme::kDHelix, PipelineShape::kInterleaved, extras, phases);
  const PipelineSchedule plain =
      make_interleaved_schedule(ctx.pp, ctx.micro_batches, ctx.virtual_pipeline);
  for (const PipelineSchedule& schedule : {make_combined_1f1b_schedule(plain), plain}) {
    SchemeRun run = run_schedule(ctx, PipelineScheme::kDHelix, schedule, costs, phases);
    out.push_back(candidate(std::move(run), false, 0, budget));
  }
}

std::string describe(const PlanShapeCandidate& c) {
  if (c.shape == PipelineShape::kV) return "the V";
  if (c.shape == PipelineShape::kInterleaved) {
    return c.si_blocks ? "interleaved stages with SI blocks (Megatron's combined 1F1B order)"
                       : "interleaved stages without SI blocks (Megatron's order: co-execution "
                         "gains nothing there)";
  }
  if (!c.split_backward) return "the W with whole backwards";
  if (c.max_deferred_weight_gradients < 0) return "the W with a split drain";
  if (c.max_deferred_weight_gradients == 0) {
    return "the W with a split drain, each weight gradient right after its input gradient";
  }
  return fmt::format("the W with a split drain, at most {} weight-gradient task{} waiting",
                     c.max_deferred_weight_gradients,
                     c.max_deferred_weight_gradients == 1 ? "" : "s");
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

// Why `best` among `all` (auto), in one line.
std::string auto_reason(const Context& ctx, const std::vector<Candidate>& all, size_t best,
                        const MemoryBudget& budget) {
  const PlanShapeCandidate& chosen = all[best].record;
  std::string out = describe(chosen);
  if (!chosen.fits) {
    return out + fmt::format(": no shape fits in {:.1f} GiB; this one needs the least ({:.1f} GiB)",
                             gib(budget.usable_bytes()), gib(chosen.peak_bytes));
  }
  // The fastest fitting candidate of another shape, for the comparison.
  const PlanShapeCandidate* rival = nullptr;
  const PlanShapeCandidate* rival_any = nullptr;
  for (const Candidate& c : all) {
    if (c.record.shape == chosen.shape) continue;
    if (rival_any == nullptr || c.record.peak_bytes < rival_any->peak_bytes) rival_any = &c.record;
    if (c.record.fits && (rival == nullptr || c.record.iteration_us < rival->iteration_us)) {
      rival = &c.record;
    }
  }
  if (rival != nullptr) {
    return out + fmt::format(": {:.1f} % faster than {} ({:.3f} ms against {:.3f} ms), both fit",
                             100.0 * (rival->iteration_us / chosen.iteration_us - 1.0),
                             describe(*rival), chosen.iteration_us / 1e3,
                             rival->iteration_us / 1e3);
  }
  if (rival_any != nullptr) {
    return out + fmt::format(": {} does not fit ({:.1f} GiB of {:.1f} usable)",
                             describe(*rival_any), gib(rival_any->peak_bytes),
                             gib(budget.usable_bytes()));
  }
  if (chosen.shape == PipelineShape::kW) {
    return out + fmt::format(": the V needs at least 2·pp = {} micro-batches, the job has {}",
                             2 * ctx.pp, ctx.micro_batches);
  }
  return out;
}

size_t best_candidate(const std::vector<Candidate>& all) {
  std::optional<size_t> best;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].record.fits) continue;
    // A later candidate must be faster by more than rounding to win a tie.
    if (!best || all[i].record.iteration_us < all[*best].record.iteration_us * (1 - 1e-9)) best = i;
  }
  if (best) return *best;
  size_t smallest = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].record.peak_bytes < all[smallest].record.peak_bytes) smallest = i;
  }
  return smallest;
}

}  // namespace

DhelixChoice choose_dhelix_shape(const Context& ctx, const ExtraCosts& extras,
                                 const MemoryBudget& budget, ShapeRequest requested,
                                 bool split_backward) {
  if (requested == ShapeRequest::kInterleaved && ctx.virtual_pipeline <= 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--shape interleaved: the job has no interleaved stages (virtual "
                            "pipeline size v = 1): Megatron interleaves only with pp > 1, m = {} "
                            "a multiple of pp = {} and each stage's layers split evenly over "
                            "v > 1 chunks; set --virtual-pipeline-model-parallel-size, or use "
                            "--shape w, v or auto",
                            ctx.micro_batches, ctx.pp));
  }
  if (requested == ShapeRequest::kV && !split_backward) {
    throw Error(ErrorCode::kInvalidInput,
                "--shape v with --no-split-backward: the V splits backwards by construction "
                "(DualPipeV's steps 3, 6 and 7); drop one of the two");
  }
  const bool v_applies = dualpipev_applies(ctx.pp, ctx.micro_batches);
  if (requested == ShapeRequest::kV && !v_applies) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--shape v: the V (DualPipeV's order) needs at least 2·pp = {} "
                            "micro-batches per iteration; the job has {} (global batch / "
                            "(micro-batch · dp)): use --shape w or auto, or a larger batch",
                            2 * ctx.pp, ctx.micro_batches));
  }
  std::vector<PlanStagePhases> phases;
  const std::vector<StageCosts> costs = stage_costs(ctx, PipelineScheme::kDHelix, extras, phases);
  std::vector<Candidate> all;
  const bool any = requested == ShapeRequest::kAuto;
  if (any || requested == ShapeRequest::kW) {
    add_w_candidates(ctx, costs, phases, budget, split_backward, all);
  }
  if ((any || requested == ShapeRequest::kV) && v_applies && split_backward) {
    SchemeRun run = run_schedule(ctx, PipelineScheme::kDHelix,
                                 make_dualpipev_schedule(ctx.pp, ctx.micro_batches), costs, phases);
    all.push_back(candidate(std::move(run), true, kUnboundedDeferral, budget));
  }
  // --no-split-backward keeps auto to the paper's W; interleaved stages split nothing.
  const bool interleaved_applies = ctx.virtual_pipeline > 1;
  if ((any && split_backward && interleaved_applies) || requested == ShapeRequest::kInterleaved) {
    add_interleaved_candidates(ctx, extras, budget, all);
  }
  size_t best = best_candidate(all);
  // A plan that takes the W or the V records the folded candidates only, so that it stays
  // what it was before interleaved stages were tried (plan format 1.3.0, byte for byte).
  if (all[best].record.shape != PipelineShape::kInterleaved) {
    std::erase_if(all,
                  [](const Candidate& c) { return c.record.shape == PipelineShape::kInterleaved; });
    best = best_candidate(all);
  }
  DhelixChoice out;
  out.record.requested = requested;
  out.record.chosen = all[best].record.shape;
  if (!split_backward && requested != ShapeRequest::kInterleaved) {
    out.record.reason = "--no-split-backward: " + describe(all[best].record);
  } else if (requested == ShapeRequest::kAuto) {
    out.record.reason = auto_reason(ctx, all, best, budget);
  } else {
    out.record.reason =
        fmt::format("--shape {}: {}", shape_request_name(requested), describe(all[best].record));
  }
  out.record.candidates.push_back(all[best].record);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i != best) out.record.candidates.push_back(all[i].record);
  }
  out.run = std::move(all[best].run);
  return out;
}

}  // namespace dhelix::plan_detail
