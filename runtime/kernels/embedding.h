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

/// The CUDA backward's sort key of a position's token: its local row + 1, or 0 for a token
/// another rank owns. A stable sort of the positions by this key (a radix sort on the GPU,
/// std::stable_sort on the host twin) lists each token's positions together, ascending,
/// which replaces the O(P^2) search for the next equal token: O(P) passes of the sort.
DHELIX_HOST_DEVICE inline uint32_t embedding_sort_key(int64_t token, int64_t vocab_begin,
                                                      int64_t vocab_local) {
  return static_cast<uint32_t>(embedding_local_row(token, vocab_begin, vocab_local) + 1);
}

/// Bits the sort needs for keys up to vocab_local: the radix sort's end bit.
DHELIX_HOST_DEVICE inline int embedding_key_bits(int64_t vocab_local) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= vocab_local) ++bits;
  return bits;
}

/// Whether sorted index i starts a run of one local token (the run's first thread writes
/// the token's table row): keys sorted, key 0 (other shards) never.
DHELIX_HOST_DEVICE inline bool embedding_run_starts(int64_t i, const uint32_t* sorted_keys) {
  return sorted_keys[i] != 0 && (i == 0 || sorted_keys[i - 1] != sorted_keys[i]);
}

/// Column col of the run starting at sorted index `begin`: `start` (the table's value) plus
/// dout(position, col) over the run's positions in sorted order, which the stable sort
/// keeps ascending: embedding_backward_column's order, so the same fp32 sums. dout is an
/// accessor float(int64_t position, int64_t col).
template <class Dout>
DHELIX_HOST_DEVICE inline float embedding_run_column_sum(int64_t begin, int64_t positions,
                                                         const uint32_t* sorted_keys,
                                                         const int32_t* sorted_positions,
                                                         int64_t col, float start, Dout dout) {
  float sum = start;
  for (int64_t i = begin; i < positions && sorted_keys[i] == sorted_keys[begin]; ++i) {
    sum += dout(sorted_positions[i], col);
  }
  return sum;
}

}  // namespace dhelix::kernels
