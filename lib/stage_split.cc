#include "lib/stage_split.h"

#include <fmt/format.h>

namespace dhelix {

std::optional<StageSplit> split_stages(int64_t num_layers, int64_t pp, int64_t first, int64_t last,
                                       std::string& why) {
  if (pp < 1 || num_layers < 1 || first < 0 || last < 0) {
    why = fmt::format("num_layers = {}, pp = {}: sizes must be positive", num_layers, pp);
    return std::nullopt;
  }
  StageSplit split;
  if (first == 0 && last == 0) {
    if (num_layers % (2 * pp) != 0) {
      why = fmt::format("num_layers = {} is not divisible by 2·pp = {}", num_layers, 2 * pp);
      return std::nullopt;
    }
    split.middle_stage_layers = num_layers / pp;
    split.unfolded.assign(static_cast<size_t>(pp), num_layers / pp);
    split.chunks.assign(static_cast<size_t>(2 * pp), num_layers / (2 * pp));
    return split;
  }
  if (pp < 2) {
    why = "uneven stages need pp >= 2 (a single stage holds every layer)";
    return std::nullopt;
  }
  const int64_t middle_stages = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const int64_t remaining = num_layers - first - last;
  if (middle_stages < 1) {
    why = fmt::format(
        "with both the first and the last stage's layers set, pp = {} leaves no middle stage; "
        "the folded layout takes its chunk size from the middle stages (use pp >= 3)",
        pp);
    return std::nullopt;
  }
  if (remaining < middle_stages || remaining % middle_stages != 0) {
    why = fmt::format(
        "the {} layers left after the first ({}) and last ({}) stages do not split evenly "
        "over the {} middle stage(s)",
        remaining, first > 0 ? std::to_string(first) : "unset",
        last > 0 ? std::to_string(last) : "unset", middle_stages);
    return std::nullopt;
  }
  const int64_t b = remaining / middle_stages;
  if (b % 2 != 0) {
    why = fmt::format(
        "the middle stages hold {} layers each, an odd count: model folding gives each of them "
        "two equal chunks",
        b);
    return std::nullopt;
  }
  const int64_t c = b / 2;
  const int64_t f = first > 0 ? first : b;
  const int64_t la = last > 0 ? last : b;
  if (f <= c || la <= c) {
    why = fmt::format(
        "folding puts F - b/2 = {} and La - b/2 = {} layers in stage 0's two chunks (b = {} "
        "layers per middle stage); both must be at least 1",
        f - c, la - c, b);
    return std::nullopt;
  }
  split.middle_stage_layers = b;
  split.unfolded.assign(static_cast<size_t>(pp), b);
  split.unfolded.front() = f;
  split.unfolded.back() = la;
  split.chunks.assign(static_cast<size_t>(2 * pp), c);
  split.chunks.front() = f - c;
  split.chunks.back() = la - c;
  return split;
}

}  // namespace dhelix
