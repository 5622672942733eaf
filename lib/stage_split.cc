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

std::optional<StageEnds> stage_ends(int64_t num_layers, const ParallelSpec& parallel,
                                    std::string& why) {
  const bool embedding = parallel.account_for_embedding;
  const bool loss = parallel.account_for_loss;
  if (!embedding && !loss)
    return StageEnds{parallel.first_stage_layers, parallel.last_stage_layers};
  if (parallel.first_stage_layers > 0 || parallel.last_stage_layers > 0) {
    why =
        "Megatron refuses the account_for flags together with decoder_first/last_pipeline_"
        "num_layers (transformer_config.py: they cannot be set at the same time)";
    return std::nullopt;
  }
  if (parallel.pp == 1) return StageEnds{};  // one stage holds every layer either way
  const int64_t counted = num_layers + (embedding ? 1 : 0) + (loss ? 1 : 0);
  if (counted % parallel.pp != 0) {
    why = fmt::format(
        "with the embedding and loss counted as layers there are {} layers, not divisible by "
        "pp = {} (Megatron's rule)",
        counted, parallel.pp);
    return std::nullopt;
  }
  const int64_t b = counted / parallel.pp;
  // F = b - 1 is unset only when it equals b; b - 1 = 0 leaves stage 0 without layers.
  if (b < 2) {
    why = fmt::format("{} layers per stage leave the first or last stage no layer", b);
    return std::nullopt;
  }
  return StageEnds{embedding ? b - 1 : 0, loss ? b - 1 : 0};
}

std::optional<StageSplit> split_job_stages(int64_t num_layers, const ParallelSpec& parallel,
                                           std::string& why) {
  const std::optional<StageEnds> ends = stage_ends(num_layers, parallel, why);
  if (!ends) return std::nullopt;
  return split_stages(num_layers, parallel.pp, ends->first, ends->last, why);
}

bool any_stage_split(int64_t num_layers, int64_t pp) {
  // The smallest splits of the rules: middle stages of b = 2 layers and the ends' chunks of
  // one layer or more. pp = 1 folds evenly or not at all; pp = 2 has one middle stage, so
  // one end is set: F = L - 2 > 1; pp >= 3: F + La = L - 2·(pp - 2) >= 4, i.e. L >= 2·pp.
  // (tests/planner/uneven_stages_test.cc checks this against every F and La.)
  if (pp < 1 || num_layers < 1) return false;
  if (pp == 1) return num_layers % 2 == 0;
  if (pp == 2) return num_layers >= 4;
  return num_layers >= 2 * pp;
}

std::optional<std::vector<std::vector<int64_t>>> interleaved_stage_layers(
    int64_t num_layers, const ParallelSpec& parallel, int64_t v, std::string& why) {
  const int64_t pp = parallel.pp;
  const auto chunks = [v](int64_t layers) {
    return std::vector<int64_t>(static_cast<size_t>(v), layers / v);
  };
  std::vector<std::vector<int64_t>> stages;
  if (parallel.account_for_embedding || parallel.account_for_loss) {
    const int64_t counted =
        num_layers + (parallel.account_for_embedding ? 1 : 0) + (parallel.account_for_loss ? 1 : 0);
    const int64_t per_stage = counted / pp;
    if (counted % pp != 0 || per_stage % v != 0) {
      why = fmt::format(
          "Megatron needs the layers per stage with the embedding and loss counted ({} / pp "
          "= {}) divisible by the virtual pipeline size {}",
          counted, pp, v);
      return std::nullopt;
    }
    stages.assign(static_cast<size_t>(pp), chunks(per_stage));
    if (parallel.account_for_embedding) stages.front().front() -= 1;
    if (parallel.account_for_loss) stages.back().back() -= 1;
    if (stages.front().front() < 1 || stages.back().back() < 1) {
      why =
          fmt::format("model chunks of {} layers leave the first or last one empty", per_stage / v);
      return std::nullopt;
    }
    return stages;
  }
  std::vector<int64_t> counts;
  if (parallel.uneven_stages()) {
    const std::optional<StageSplit> split = split_job_stages(num_layers, parallel, why);
    if (!split) return std::nullopt;
    counts = split->unfolded;
  } else if (num_layers % pp == 0) {
    counts.assign(static_cast<size_t>(pp), num_layers / pp);
  } else {
    why = fmt::format("num_layers = {} is not divisible by pp = {}", num_layers, pp);
    return std::nullopt;
  }
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] % v != 0) {
      why = fmt::format(
          "Megatron needs every stage's layers divisible by the virtual pipeline "
          "size {}; stage {} holds {}",
          v, p, counts[p]);
      return std::nullopt;
    }
    stages.push_back(chunks(counts[p]));
  }
  return stages;
}

}  // namespace dhelix
