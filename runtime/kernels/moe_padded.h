#pragma once
// The padded row layout of a MoE layer on the CUDA backend: every buffer between permute
// and unpermute has a shape known on the host, so that the all-to-alls and the expert
// GEMMs can be enqueued without reading the routing back (no host wait in an iteration).
//
// With capacity C (moe_capacity.h: ceil(cf T k / E), or T for dropless routing), each of
// the E experts receives at most C of a rank's assignments. Permute writes them into E
// blocks of C rows, block e for expert e, the kept assignments of e in ascending assignment
// order (the CPU's order within an expert, runtime/cpu/moe_cpu.cc), the rest of the block
// zero (assign_padded_rows, one expert at a time):
//
//   padded row of kept assignment a = chosen[a] * C + (kept assignments to chosen[a] before a)
//
// With ep members and L = E / ep local experts, the blocks of member j's experts
// [j L, (j + 1) L) are contiguous: the dispatch sends L C rows to each member. What
// arrives is source-major, [ep sources][L experts][C rows]; the grouped GEMMs read it
// expert-major, [L experts][ep sources][C rows] (ep C rows per local expert):
//
//   source-major row (src, e, r) = (src * L + e) * C + r
//   expert-major row (e, src, r) = (e * ep + src) * C + r
//
// Worked example: E = 4, ep = 2 (L = 2), C = 2. Member 0's permuted buffer has 8 rows;
// rows 4..7 (experts 2, 3) go to member 1. Member 1 receives [src 0: e2 r0 r1, e3 r0 r1;
// src 1: e2 r0 r1, e3 r0 r1]; source-major row 5 = (src 1, e 0, r 1) is expert-major row
// (0 * 2 + 1) * 2 + 1 = 3. A zero row stays zero through fc1, SwiGLU (silu(0) * 0) and
// fc2, and adds nothing to the weight gradients (its input and its gradient are zero).

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// A MoE layer's sizes on one rank (capacity > 0: the padded layout needs one).
struct MoePaddedShape {
  int64_t tokens = 0;         ///< T
  int64_t hidden = 0;         ///< h
  int64_t experts = 0;        ///< E
  int64_t top_k = 0;          ///< k
  int64_t capacity = 0;       ///< C (moe_capacity.h's expert_capacity with cf > 0)
  double aux_loss_coeff = 0;  ///< alpha of the load-balancing loss
};

/// The routing of one micro-batch, in the backend's memory (written by the router op,
/// read by the others).
struct MoePaddedRouting {
  int32_t* chosen = nullptr;       ///< [T, k]
  float* gate = nullptr;           ///< [T, k] softmax over the chosen (before dropping)
  float* probs = nullptr;          ///< [T, E] full softmax
  uint8_t* kept = nullptr;         ///< [T, k]
  int64_t* row = nullptr;          ///< [T, k] padded row of a kept assignment, -1 dropped
  int64_t* routed = nullptr;       ///< [E] n_e before dropping
  int64_t* send_counts = nullptr;  ///< [E] elements of kept rows per expert (rows * h)
  float* aux_loss = nullptr;       ///< [1] L_aux of these tokens
};

/// Expert e's padded rows: walks the assignments in index order and gives each kept one
/// routed to e the next row of e's block (row[a] = e C + the kept assignments to e with a
/// lower index), each dropped one -1. Returns how many e kept. chosen[assignments],
/// kept[assignments] (1 kept). One call per expert (one GPU thread each): O(assignments).
DHELIX_HOST_DEVICE inline int64_t assign_padded_rows(int64_t assignments, const int32_t* chosen,
                                                     const uint8_t* kept, int64_t capacity,
                                                     int64_t e, int64_t* row) {
  int64_t next = 0;
  for (int64_t a = 0; a < assignments; ++a) {
    if (chosen[a] != e) continue;
    row[a] = kept[a] != 0 ? e * capacity + next++ : -1;
  }
  return next;
}

/// The expert-major row of source-major row `row` ([ep][local][capacity] rows), or back
/// with to_expert false.
DHELIX_HOST_DEVICE inline int64_t padded_regroup_row(int64_t row, int64_t ep, int64_t local,
                                                     int64_t capacity, bool to_expert) {
  const int64_t r = row % capacity;
  const int64_t block = row / capacity;
  if (to_expert) {
    const int64_t src = block / local, e = block % local;
    return (e * ep + src) * capacity + r;
  }
  const int64_t e = block / ep, src = block % ep;
  return (src * local + e) * capacity + r;
}

/// Rows of the padded permuted buffer of one rank: experts x capacity (also the rows
/// that arrive from all ep members: ep x local x capacity).
DHELIX_HOST_DEVICE inline int64_t padded_rows(int64_t experts, int64_t capacity) {
  return experts * capacity;
}

}  // namespace dhelix::kernels
