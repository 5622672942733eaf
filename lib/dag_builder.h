#pragma once
// Builds the operator DAGs of one transformer layer (and of a pipeline stage's extra work:
// embedding, final norm, head, loss) for one rank of a job, with per-rank shapes, FLOPs,
// bytes and communication groups. See dag_builder.cc for the worked example and the
// reasons behind every edge.

#include <cstdint>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"

namespace dhelix {

/// One transformer layer's forward and backward DAGs on `rank` (0 <= rank < world size).
/// Supports tp (with or without SP), cp >= 1 (ring attention), dense or MoE MLPs with ep.
/// Throws Error(kUnsupported) for a MoE model with tp > 1 and no sequence parallelism
/// (Megatron refuses that combination too). The job is assumed valid (validate_job).
LayerDags build_layer_dags(const JobSpec& job, int64_t rank);

/// The work a pipeline stage does besides its layers: the token embedding when
/// `first_stage`, the final norm, output head and loss when `last_stage` (under DHelix's
/// folding stage 0 is both; the planner decides which flags to pass). The forward DAG holds
/// the embedding chain and the head chain as two unconnected parts: they run at opposite
/// ends of the stage's layers. Either flag false leaves its part out; both false gives
/// empty DAGs.
LayerDags build_stage_extras(const JobSpec& job, int64_t rank, bool first_stage, bool last_stage);

/// `dags` (a layer's, from build_layer_dags or build_intra_batch_layer_dags) with the
/// forward ops that `granularity` recomputes repeated in the backward DAG
/// (dag_builder_recompute.cc): every forward op for kFull, the core attention for
/// kSelective, nothing for kNone. The forward DAG is unchanged.
LayerDags with_recompute(LayerDags dags, RecomputeGranularity granularity);

}  // namespace dhelix
