#pragma once
// The sizes one rank sees of a layer and of the stage extras, under its job's tensor,
// context and expert parallelism: what the DAG builder costs (lib/dag_builder*.cc) and
// what the runtime allocates (runtime/model/). One function computes them for both, so
// that the planner's shapes and the runtime's buffers cannot drift apart.

#include <cstdint>

#include "lib/job_spec.h"

namespace dhelix {

struct RankShape {
  int64_t tp = 1, cp = 1, ep = 1;
  int64_t tp_rank = 0;      ///< this rank's index in its TP group
  bool sp = false;          ///< sequence parallelism in effect (tp > 1 and sp asked)
  int64_t micro_batch = 1;  ///< sequences in a micro-batch
  int64_t seq_shard = 0;    ///< tokens of one sequence on this rank: seq_length / cp
  int64_t tokens = 0;       ///< T = micro_batch x seq_shard: rows entering a GEMM
  int64_t rows = 0;         ///< rows of norms, bias-dropout-add, residual: T / tp with SP
  int64_t hidden = 0;       ///< h
  int64_t head_dim = 0;     ///< d
  int64_t heads = 0;        ///< attention heads on this rank: H / tp
  int64_t kv_heads = 0;     ///< KV heads on this rank: G / tp
  int64_t q_width = 0;      ///< heads x d
  int64_t kv_width = 0;     ///< kv_heads x d
  int64_t qkv_width = 0;    ///< q_width + 2 kv_width: the fused QKV GEMM's output columns
  int64_t ffn = 0;          ///< dense FFN columns on this rank: F / tp
  int64_t vocab = 0;        ///< V
  int64_t vocab_shard = 0;  ///< ceil(V / tp): entries per rank, the last may hold fewer
  int64_t vocab_begin = 0;  ///< first vocabulary entry of this rank
  int64_t vocab_local = 0;  ///< entries this rank holds
  int64_t num_layers = 0;   ///< of the whole model

  /// Elements of one residual-stream buffer on this rank (rows x h).
  int64_t residual_elements() const { return rows * hidden; }
  /// Elements of a gathered activation (T x h).
  int64_t full_elements() const { return tokens * hidden; }
};

/// World rank `rank`'s shape. The job must be valid (lib/job_reader.h checks it): tp
/// divides the attention and KV heads, cp divides the sequence, tp divides the tokens
/// under SP; DHELIX_CHECKs that. ffn is rounded down where tp does not divide F (MoE
/// models, whose experts' widths come from the model's moe fields).
RankShape rank_shape(const JobSpec& job, int64_t rank);

}  // namespace dhelix
