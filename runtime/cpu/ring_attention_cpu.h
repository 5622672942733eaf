#pragma once
// Ring attention of context parallelism on the CPU backend, one ring step at a time: the
// plan's CP ops are the K/V send/recv steps, and between them each rank folds the visiting
// key block into its queries (lib/dag_builder_cp.cc). Rank r holds chunks r and
// 2·cp - 1 - r of every sequence (runtime/kernels/context_parallel.h); at step s it holds
// the K/V block of CP rank (r - s) mod cp, step 0 being its own.
//
// Forward: every query row keeps its online-softmax state (running max, sum and the
// unnormalised output, runtime/kernels/attention.h) across the steps; each step folds the
// keys of the block the causal mask lets it see, in tiles of kAttentionTileKeys per chunk,
// and ring_attention_forward_finish normalises and writes lse. The result equals causal
// attention over the whole sequence up to the rounding of a different fold order
// (docs/kernels.md states the tolerance the tests hold it to).
//
// Backward (the dK/dV ring): with the forward's global lse and delta_i = dout_i . out_i,
// each step adds the block's share to the local dq and accumulates the block's dk and dv
// from the local queries; those travel with the block and are home after cp steps. All
// sums run in step order, then ascending position within a step.
//
// Layouts are those of attention.h with seq = the rank's 2·chunk local tokens: q, dq, out,
// dout [batch, 2c, heads, d]; k, v, dk, dv [batch, 2c, kv_heads, d]; lse, delta and the
// state [batch, heads, 2c].

#include <cstdint>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cpu {

/// Which rank holds what: CP size, this rank, the block's owner, tokens per chunk.
struct RingStep {
  int64_t cp = 1;
  int64_t rank = 0;        ///< this rank's CP index (its queries)
  int64_t block_rank = 0;  ///< the CP index whose K/V block is visiting
  int64_t chunk = 0;       ///< c: tokens per chunk; the local sequence is 2c
};

/// Online-softmax state of every local query row, kept across the steps of one forward.
struct RingForwardState {
  std::vector<kernels::OnlineSoftmaxState> rows;  ///< [batch, heads, 2c]
  std::vector<float> acc;                         ///< [batch, 2c, heads, d]

  /// Empties the state for a forward of `shape` (seq = 2c).
  void reset(const kernels::AttentionShape& shape);
};

/// Folds the visiting block k, v into the state of the local queries q.
void ring_attention_forward_step(const kernels::AttentionShape& shape, const RingStep& step,
                                 const float* q, const float* k, const float* v,
                                 RingForwardState& state);

/// Writes out and lse from the state after the last step.
void ring_attention_forward_finish(const kernels::AttentionShape& shape, RingForwardState& state,
                                   float* out, float* lse);

/// delta[batch, heads, 2c] = dout_i . out_i per local query row.
void ring_attention_backward_delta(const kernels::AttentionShape& shape, const float* out,
                                   const float* dout, float* delta);

/// Adds the visiting block's share to dq_unscaled (dq / scale) and the local queries' share
/// to the block's dk_unscaled (dk / scale) and dv, all accumulated (+=).
void ring_attention_backward_step(const kernels::AttentionShape& shape, const RingStep& step,
                                  const float* q, const float* dout, const float* lse,
                                  const float* delta, const float* k, const float* v,
                                  float* dq_unscaled, float* dk_unscaled, float* dv);

/// Multiplies `count` accumulated values by the score scale (dq or dk after the last step).
void ring_attention_scale(const kernels::AttentionShape& shape, int64_t count, float* values);

/// RoPE of a rank's local tokens x[batch, 2c, heads, head_dim] at their global positions:
/// the early chunk at rank·c, the late one at (2·cp - 1 - rank)·c. `table` must hold the
/// whole sequence's 2·cp·c positions. Equals rope_forward over the whole sequence, row for
/// row, bit for bit (the same table entries).
void rope_forward_cp(const RopeTable& table, int64_t batch, int64_t cp, int64_t rank, int64_t chunk,
                     int64_t heads, float* x);
/// The inverse rotation (the backward of rope_forward_cp), in place.
void rope_backward_cp(const RopeTable& table, int64_t batch, int64_t cp, int64_t rank,
                      int64_t chunk, int64_t heads, float* dy);

}  // namespace dhelix::cpu
