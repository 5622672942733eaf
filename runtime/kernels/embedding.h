#pragma once
// Token embedding: a gather forward and a scatter-add backward, with the vocabulary
// optionally split across tensor-parallel ranks (Megatron's VocabParallelEmbedding):
// this rank holds table rows [vocab_begin, vocab_begin + vocab_local); a token outside
// that range reads zeros (the group's all-reduce adds the owner's row) and scatters
// nothing.
//   forward:  out[r, :] = table[token_r - vocab_begin, :]   (or 0)
//   backward: dtable[token_r - vocab_begin, :] += dout[r, :]   for r = 0, 1, 2, ...
// Determinism: two positions with the same token add into the same table row. The
// additions always happen in ascending position order r, whether the CPU loops rows
// outermost (embedding_backward_accumulate_row) or a CUDA thread owns one column and
// walks the rows (embedding_backward_column): the same sums, the same bits, no atomics.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Index of token in this rank's table, or -1 when another rank owns it.
DHELIX_HOST_DEVICE inline int64_t embedding_local_row(int64_t token, int64_t vocab_begin,
                                                      int64_t vocab_local) {
  int64_t local = token - vocab_begin;
  return (local >= 0 && local < vocab_local) ? local : -1;
}

/// Forward of one position: out[dim] = the token's table row, or zeros.
DHELIX_HOST_DEVICE inline void embedding_forward_row(int64_t dim, const float* table,
                                                     int64_t vocab_begin, int64_t vocab_local,
                                                     int64_t token, float* out) {
  int64_t local = embedding_local_row(token, vocab_begin, vocab_local);
  for (int64_t i = 0; i < dim; ++i) out[i] = local < 0 ? 0.0f : table[local * dim + i];
}

/// Backward of one position: adds dout[dim] into the token's row of dtable, if local.
DHELIX_HOST_DEVICE inline void embedding_backward_accumulate_row(int64_t dim, const float* dout,
                                                                 int64_t vocab_begin,
                                                                 int64_t vocab_local, int64_t token,
                                                                 float* dtable) {
  int64_t local = embedding_local_row(token, vocab_begin, vocab_local);
  if (local < 0) return;
  for (int64_t i = 0; i < dim; ++i) dtable[local * dim + i] += dout[i];
}

/// Backward of one column `col` over all positions in ascending order: what one CUDA
/// thread does. tokens is [positions]; dout is [positions, dim]; dtable is
/// [vocab_local, dim] and accumulates.
DHELIX_HOST_DEVICE inline void embedding_backward_column(int64_t positions, int64_t dim,
                                                         int64_t col, const int64_t* tokens,
                                                         const float* dout, int64_t vocab_begin,
                                                         int64_t vocab_local, float* dtable) {
  for (int64_t r = 0; r < positions; ++r) {
    int64_t local = embedding_local_row(tokens[r], vocab_begin, vocab_local);
    if (local >= 0) dtable[local * dim + col] += dout[r * dim + col];
  }
}

}  // namespace dhelix::kernels
