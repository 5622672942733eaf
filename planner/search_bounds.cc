#include "planner/search_bounds.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/stage_split.h"
#include "planner/profile_co_run.h"
#include "planner/segment_cost.h"
#include "planner/strand_graph.h"
#include "planner/virtual_pipeline.h"

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

// What a micro-batch's embedding and head-loss steps take at least, forward and backward
// alone each (build_stage_extras's two chains), in us.
struct StageExtrasFloor {
  double embedding_us = 0;
  double head_us = 0;
};

StageExtrasFloor extras_floor(const JobSpec& job, const SoloTime& solo_time_us) {
  const LayerDags embedding = build_stage_extras(job, 0, true, false);
  const LayerDags head = build_stage_extras(job, 0, false, true);
  const auto alone = [&](const LayerDags& dags) {
    return strand_floor(dags.forward, solo_time_us, job.cluster).alone_us() +
           strand_floor(dags.backward, solo_time_us, job.cluster).alone_us();
  };
  return {.embedding_us = alone(embedding), .head_us = alone(head)};
}

// One pipeline layout: its layers per stage, the layers ahead of each stage, and which
// stages run the embedding and the head-loss steps.
struct LayoutShape {
  std::vector<int64_t> before;
  std::vector<int64_t> layers;
  size_t embedding_stage = 0;
  size_t head_stage = 0;
};

// P with slow-downs: both strands' solo work per stream under the co-run load bound of the
// profile's rates (co_run_bound.h), as the pairing search's BlockCostModel derives it.
double co_run_pair_floor_us(const LayerDags& dags, const Profile& profile) {
  const auto solo = [&profile](const Op& op) { return profile_solo_time_us(profile, op); };
  const StrandGraph forward = from_layer_dag(dags.forward, solo);
  const StrandGraph backward = from_layer_dag(dags.backward, solo);
  const PairTimesCoRunModel co_run = profile_co_run_model(profile);
  const BlockCostModel model(forward, backward, co_run);
  std::array<double, 3> load_us{};
  for (const StrandGraph* graph : {&forward, &backward}) {
    for (int64_t i = 0; i < graph->size(); ++i) {
      load_us[static_cast<size_t>(graph->op(i).stream)] += graph->op(i).solo_time_us;
    }
  }
  return model.load_bound().bound_us(load_us);
}

// The bound of one pipeline layout: for each stage, the first micro-batch's embedding and
// forward through the `before` layers ahead of it, the stage's own `layers` for every
// micro-batch at `per_layer_us` each with its embedding and head-loss steps, and the last
// micro-batch's backward back through the `before` layers and the embedding (see
// search_bounds.h).
double layout_bound_us(const LayoutShape& layout, int64_t micro_batches, double per_layer_us,
                       double ramp_per_layer_us, const StageExtrasFloor& extras) {
  const auto m = static_cast<double>(micro_batches);
  double bound = 0;
  for (size_t s = 0; s < layout.layers.size(); ++s) {
    const bool embeds = s == layout.embedding_stage;
    double stage_us = static_cast<double>(layout.before[s]) * ramp_per_layer_us +
                      m * static_cast<double>(layout.layers[s]) * per_layer_us;
    stage_us += embeds ? m * extras.embedding_us : extras.embedding_us;
    if (s == layout.head_stage) stage_us += m * extras.head_us;
    bound = std::max(bound, stage_us);
  }
  return bound;
}

}  // namespace

SchemeBounds lower_bounds(const JobSpec& job, const SoloTime& solo_time_us,
                          const Profile* profile) {
  const ParallelSpec& p = job.parallel;
  std::string why;
  // validate_job passed, and the search chose the split where the planner would
  // (planner_chooses_split, lib/stage_split_choice.h).
  const std::optional<StageSplit> split = split_job_stages(job.model.num_layers, p, why);
  DHELIX_CHECK_MSG(split.has_value(), why);
  const LayerDags dags = bound_dags(job);
  const StrandFloor f = strand_floor(dags.forward, solo_time_us, job.cluster);
  const StrandFloor b = strand_floor(dags.backward, solo_time_us, job.cluster);
  const int64_t micro_batches = p.global_batch_size / (p.dp * p.micro_batch_size);
  const size_t pp = static_cast<size_t>(p.pp);
  LayoutShape unfolded{.before = std::vector<int64_t>(pp, 0),
                       .layers = split->unfolded,
                       .embedding_stage = 0,
                       .head_stage = pp - 1};
  LayoutShape folded{.before = std::vector<int64_t>(pp, 0),
                     .layers = std::vector<int64_t>(pp, 0),
                     .embedding_stage = 0,
                     .head_stage = 0};  // stage 0's up chunk holds the last layer
  for (size_t s = 0; s < pp; ++s) {
    if (s > 0) {
      unfolded.before[s] = unfolded.before[s - 1] + split->unfolded[s - 1];
      folded.before[s] = folded.before[s - 1] + split->chunks[s - 1];
    }
    folded.layers[s] = split->chunks[s] + split->chunks[2 * pp - 1 - s];
  }
  const StageExtrasFloor extras = extras_floor(job, solo_time_us);
  double pair_us = pair_floor_us(f, b);
  if (profile != nullptr) pair_us = std::max(pair_us, co_run_pair_floor_us(dags, *profile));
  // dhelix's W and V may split a backward: the last gradient leaves a stage after its input
  // gradient, so its ramp counts the backward without the weight-gradient GEMMs.
  const SoloTime input_gradient_us = [&solo_time_us](const ClusterSpec& cluster, const Op& op) {
    return backward_work(op) == BackwardWork::kWeightGradient ? 0.0 : solo_time_us(cluster, op);
  };
  const StrandFloor input = strand_floor(dags.backward, input_gradient_us, job.cluster);
  const double alone_us = f.alone_us() + b.alone_us();
  double dhelix_us =
      layout_bound_us(folded, micro_batches, pair_us, f.alone_us() + input.alone_us(), extras);
  // dhelix may also take Megatron's interleaved stages (planner/dhelix_shapes.h): stage s
  // then waits only for the first model chunks of the stages ahead of it. Its pairs are SI
  // blocks or strands alone, so P and F + I bound them as well.
  const int64_t v = virtual_pipeline_size(job, micro_batches, 0);
  if (const auto chunks =
          v > 1 ? interleaved_stage_layers(job.model.num_layers, p, v, why) : std::nullopt) {
    LayoutShape interleaved = unfolded;
    for (size_t s = 1; s < pp; ++s) {
      interleaved.before[s] = interleaved.before[s - 1] + (*chunks)[s - 1].front();
    }
    dhelix_us = std::min(dhelix_us, layout_bound_us(interleaved, micro_batches, pair_us,
                                                    f.alone_us() + input.alone_us(), extras));
  }
  return {.dhelix_us = dhelix_us,
          .megatron_us = layout_bound_us(unfolded, micro_batches, alone_us, alone_us, extras)};
}

}  // namespace dhelix
