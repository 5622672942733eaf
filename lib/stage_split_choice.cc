#include "lib/stage_split_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

namespace dhelix {
namespace {

// One candidate's order (the file comment's rule): busiest stage over both layouts, then the
// busiest 1F1B stage, then |F - La|, then F.
using Order = std::tuple<double, double, int64_t, int64_t>;

struct Candidate {
  ChosenSplit split;
  Order order;
};

// The work of both layouts' busiest stages for F, La (both set; La = b or F = b stands for
// an unset end) and b layers on each middle stage.
Candidate evaluate(int64_t first, int64_t last, int64_t b, const SplitTimes& t, StageEnds ends) {
  const double middle = static_cast<double>(b) * t.layer_us;
  const double folded_stage0 =
      static_cast<double>(first + last - b) * t.layer_us + t.embedding_us + t.head_loss_us;
  const double first_stage = static_cast<double>(first) * t.layer_us + t.embedding_us;
  const double last_stage = static_cast<double>(last) * t.layer_us + t.head_loss_us;
  const double unfolded = std::max({middle, first_stage, last_stage});
  const double busiest = std::max(unfolded, folded_stage0);
  return {.split = {.ends = ends, .middle_layers = b, .busiest_us = busiest},
          .order = {busiest, unfolded, std::abs(first - last), first}};
}

}  // namespace

std::optional<ChosenSplit> choose_stage_split(int64_t num_layers, int64_t pp,
                                              const SplitTimes& times, std::string& why) {
  if (pp < 2 || !any_stage_split(num_layers, pp)) {
    why = fmt::format(
        "no split of num_layers = {} over pp = {} stages meets the rules of "
        "docs/pipeline.md (\"Uneven stages\"){}",
        num_layers, pp, pp >= 3 ? fmt::format(": it needs num_layers >= 2·pp = {}", 2 * pp) : "");
    return std::nullopt;
  }
  std::optional<Candidate> best;        // over every split
  std::optional<Candidate> best_equal;  // over F = La: the W's stage 0 gets equal chunks
  const auto consider = [&](const Candidate& c) {
    std::string unused;
    if (!split_stages(num_layers, pp, c.split.ends.first, c.split.ends.last, unused)) return;
    if (!best || c.order < best->order) best = c;
    if (c.split.ends.first == c.split.ends.last && (!best_equal || c.order < best_equal->order)) {
      best_equal = c;
    }
  };
  if (pp == 2) {
    // One end is set, the other is the middle stage: F + b = L (or b + La = L).
    for (int64_t b = 2; b < num_layers; b += 2) {
      const int64_t end = num_layers - b;
      consider(evaluate(end, b, b, times, {end, 0}));
      consider(evaluate(b, end, b, times, {0, end}));
    }
  } else {
    for (int64_t b = 2; (pp - 2) * b < num_layers; b += 2) {
      const int64_t ends = num_layers - (pp - 2) * b;
      for (int64_t first = b / 2 + 1; ends - first > b / 2; ++first) {
        consider(evaluate(first, ends - first, b, times, {first, ends - first}));
      }
    }
  }
  if (!best) {
    why = fmt::format("no split of num_layers = {} over pp = {} stages meets the rules", num_layers,
                      pp);
    return std::nullopt;
  }
  return best_equal ? best_equal->split : best->split;
}

bool planner_chooses_split(int64_t num_layers, const ParallelSpec& parallel) {
  return parallel.pp >= 2 && num_layers % (2 * parallel.pp) != 0 && !parallel.uneven_stages();
}

}  // namespace dhelix
