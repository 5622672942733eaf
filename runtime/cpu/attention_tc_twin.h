#pragma once
// Host twin of the tensor-core attention kernels (runtime/cuda/attention_tc.h): the same
// tiles, the same skips, the same online-softmax steps and the same bf16 roundings, as
// plain C++ that the CPU tests run against the reference attention (attention.h) and ring
// attention (ring_attention_cpu.h), and that tests/gpu compares the kernels with.
//
// Tiling (kernels_attention_tc*.cu):
//
//   pass      unit of work (one warp)            partner tiles, per run of the layout
//   forward   16 query rows of one query head    64 keys from the run's first key, ascending
//   dq        16 query rows of one query head    64 keys, ascending
//   dk/dv     16 key rows of one KV head, for    32 queries from the run's first query,
//             the query heads g = w, w+W, ...    ascending; W = min(group, 4) warps reduce
//             of the group (warp w of W)          their partial sums in ascending warp order
//
// What the tensor cores change against the reference, and the twin reproduces:
//   - P (forward) and dS, P (backward) are rounded to bf16 before they multiply V, K,
//     dout or q (an mma takes bf16 operands); the softmax sum uses the fp32 P;
//   - the online softmax rescales once per 64-key tile of a run, whatever the query.
// What the twin does not reproduce: the order of the fp32 additions inside one mma and
// of the four lanes' partial softmax sums, and CUDA's expf against glibc's (an ulp). The
// twin and the kernels therefore agree to rounding (tests/gpu/attention_tc_gpu_test.cc),
// the twin and the reference to the bound stated in docs/kernels.md.
//
// Inputs are fp32 holding bf16 values (the kernels' operands); layouts as attention.h,
// positions from kernels::TokenLayout (queries and keys may sit in different places: a
// ring step). All outputs accumulate, so a ring step adds its share.

#include <cstdint>

#include "runtime/cpu/ring_attention_cpu.h"
#include "runtime/kernels/attention.h"
#include "runtime/kernels/attention_layout.h"

namespace dhelix::cpu {

/// Rows per warp (an mma's M), keys per forward / dq tile, queries per dk/dv tile, warps
/// of a dk/dv block.
inline constexpr int64_t kTcSliceRows = 16;
inline constexpr int64_t kTcTileKeys = 64;
inline constexpr int64_t kTcDkdvQueryTile = 32;
inline constexpr int64_t kTcMaxGroupWarps = 4;

/// fp32 -> bf16 -> fp32, round to nearest even (the kernels' __float2bfloat16_rn).
float round_bf16(float value);

/// Folds the keys k, v into the online-softmax state of the queries q (state.rows in
/// [batch, heads, seq], state.acc [batch, seq, heads, d]); ring_attention_forward_finish
/// then writes out and lse. Plain causal attention is one step with causal layouts.
void tc_twin_forward_step(const kernels::AttentionShape& shape,
                          const kernels::AttentionLayouts& layouts, const float* q, const float* k,
                          const float* v, RingForwardState& state);

/// dq_unscaled (dq / scale) += the keys' share, per query row.
void tc_twin_backward_dq(const kernels::AttentionShape& shape,
                         const kernels::AttentionLayouts& layouts, const float* q,
                         const float* dout, const float* lse, const float* delta, const float* k,
                         const float* v, float* dq_unscaled);

/// dk_unscaled (dk / scale) += and dv += the queries' share, per key row, the group's heads
/// split over W warps and reduced in warp order.
void tc_twin_backward_dkdv(const kernels::AttentionShape& shape,
                           const kernels::AttentionLayouts& layouts, const float* q,
                           const float* dout, const float* lse, const float* delta, const float* k,
                           const float* v, float* dk_unscaled, float* dv);

}  // namespace dhelix::cpu
