#pragma once
// The layer DAGs of the "Intra-batch" baseline (DHelix paper, sections 2.3 and 6.1):
// Megatron-LM with MegaScale-style overlap of tensor-parallel communication inside one
// micro-batch. Each all-gather feeding a GEMM and each GEMM feeding a reduce-scatter is cut
// into tp ring send/recv steps and tp GEMM chunks so that one chunk computes while the next
// shard travels. dag_builder_intra_batch.cc has the worked example and the edges.

#include <cstdint>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"

namespace dhelix {

/// One transformer layer's forward and backward DAGs on `rank` with the TP communication
/// of sequence parallelism decomposed into overlappable chunks:
///   all-gather -> GEMM (forward gemm_qkv, gemm_fc1; backward fc2_dgrad, proj_dgrad)
///     becomes steps "<allgather id>.step1" .. ".step<tp-1>" (send/recv of one shard each
///     over the TP group) and chunks "<gemm id>.chunk0" .. ".chunk<tp-1>" of m/tp rows;
///   GEMM -> reduce-scatter (forward gemm_proj, gemm_fc2; backward qkv_dgrad, fc1_dgrad)
///     becomes chunks "<gemm id>.chunk0" .. and steps "<reduce-scatter id>.step1" .. .
/// Weight-gradient GEMMs stay whole (they read the full gathered input). Every other op,
/// the CP ring and MoE all-to-alls included, is as build_layer_dags makes it. Without
/// sequence parallelism or with tp == 1 the result equals build_layer_dags(job, rank).
/// Throws what build_layer_dags throws.
LayerDags build_intra_batch_layer_dags(const JobSpec& job, int64_t rank);

}  // namespace dhelix
