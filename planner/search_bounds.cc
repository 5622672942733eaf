#include "planner/search_bounds.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/stage_split.h"

namespace dhelix {
namespace {

// The layer DAGs every layer of the job runs at least: with the recomputed forward ops in
// the backward when every layer recomputes (uniform full or selective), plain otherwise
// (block recompute leaves some layers plain).
LayerDags bound_dags(const JobSpec& job) {
  const RecomputeSpec& r = job.parallel.recompute;
  const bool every_layer =
      r.granularity == RecomputeGranularity::kSelective ||
      (r.granularity == RecomputeGranularity::kFull && r.method == RecomputeMethod::kUniform);
  LayerDags dags = build_layer_dags(job, 0);
  return every_layer ? with_recompute(std::move(dags), r.granularity) : dags;
}

// What no schedule of one layer's strand can beat, in us: the busiest stream's solo work
// (each stream runs one op at a time) and the longest dependency chain at solo times
// (co-running only slows ops down).
struct StrandFloor {
  std::array<double, 3> per_stream{};  ///< solo work per StreamClass
  double longest_path_us = 0;

  double alone_us() const {
    return std::max(longest_path_us, *std::max_element(per_stream.begin(), per_stream.end()));
  }
};

StrandFloor strand_floor(const LayerDag& dag, const SoloTime& solo_time_us,
                         const ClusterSpec& cluster) {
  StrandFloor floor;
  std::vector<double> finish(static_cast<size_t>(dag.size()), 0);
  for (int64_t v : dag.topological_order()) {
    const double time_us = solo_time_us(cluster, dag.op(v));
    floor.per_stream[static_cast<size_t>(dag.op(v).stream)] += time_us;
    double start = 0;
    for (int64_t u : dag.predecessors(v)) start = std::max(start, finish[static_cast<size_t>(u)]);
    finish[static_cast<size_t>(v)] = start + time_us;
    floor.longest_path_us = std::max(floor.longest_path_us, finish[static_cast<size_t>(v)]);
  }
  return floor;
}

// A forward beside a backward (dhelix's SI pair): both strands' work on the busiest stream.
double pair_floor_us(const StrandFloor& f, const StrandFloor& b) {
  double busiest = std::max(f.longest_path_us, b.longest_path_us);
  for (size_t s = 0; s < f.per_stream.size(); ++s) {
    busiest = std::max(busiest, f.per_stream[s] + b.per_stream[s]);
  }
  return busiest;
}

// The bound of one pipeline layout: for each stage, the first micro-batch's forward through
// the `before` layers ahead of it, the stage's own `layers` for every micro-batch at
// `per_layer_us` each, and the last micro-batch's backward back through the `before` layers
// (see search_bounds.h).
double layout_bound_us(const std::vector<int64_t>& before, const std::vector<int64_t>& layers,
                       int64_t micro_batches, double per_layer_us, const StrandFloor& f,
                       const StrandFloor& b) {
  double bound = 0;
  for (size_t s = 0; s < layers.size(); ++s) {
    const double ramp = static_cast<double>(before[s]) * (f.alone_us() + b.alone_us());
    bound = std::max(bound, ramp + static_cast<double>(micro_batches * layers[s]) * per_layer_us);
  }
  return bound;
}

}  // namespace

SchemeBounds lower_bounds(const JobSpec& job, const SoloTime& solo_time_us) {
  const ParallelSpec& p = job.parallel;
  std::string why;
  const std::optional<StageSplit> split =
      split_stages(job.model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers, why);
  DHELIX_CHECK(split.has_value());  // validate_job passed
  const LayerDags dags = bound_dags(job);
  const StrandFloor f = strand_floor(dags.forward, solo_time_us, job.cluster);
  const StrandFloor b = strand_floor(dags.backward, solo_time_us, job.cluster);
  const int64_t micro_batches = p.global_batch_size / (p.dp * p.micro_batch_size);
  const size_t pp = static_cast<size_t>(p.pp);
  std::vector<int64_t> unfolded_before(pp, 0), folded_before(pp, 0), folded_layers(pp, 0);
  for (size_t s = 0; s < pp; ++s) {
    if (s > 0) {
      unfolded_before[s] = unfolded_before[s - 1] + split->unfolded[s - 1];
      folded_before[s] = folded_before[s - 1] + split->chunks[s - 1];
    }
    folded_layers[s] = split->chunks[s] + split->chunks[2 * pp - 1 - s];
  }
  return {.dhelix_us = layout_bound_us(folded_before, folded_layers, micro_batches,
                                       pair_floor_us(f, b), f, b),
          .megatron_us = layout_bound_us(unfolded_before, split->unfolded, micro_batches,
                                         f.alone_us() + b.alone_us(), f, b)};
}

}  // namespace dhelix
