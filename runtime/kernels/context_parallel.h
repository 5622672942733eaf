#pragma once
// Context parallelism's sequence split (Megatron-LM's load-balanced causal split): a
// sequence of S tokens is cut into 2·cp chunks of c = S / (2·cp) tokens, and CP rank r
// holds chunks r and 2·cp - 1 - r, in that order, as its S / cp local tokens. Under a
// causal mask a late chunk attends to many keys and an early one to few; pairing them
// gives every rank the same attention work.
//
//   cp = 2, S = 8, c = 2:   chunks  [0 1] [2 3] [4 5] [6 7]
//                           rank 0 holds chunks 0 and 3: positions 0 1 6 7
//                           rank 1 holds chunks 1 and 2: positions 2 3 4 5
//
// Ring attention (runtime/cpu/ring_attention_cpu.h) asks, for a query and a visiting key
// block, which keys a query may see; the position functions below answer it.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Global position of local token `local` (0 <= local < 2 * chunk) of CP rank `rank` of
/// `cp`, with chunks of `chunk` tokens.
DHELIX_HOST_DEVICE inline int64_t cp_global_position(int64_t cp, int64_t rank, int64_t chunk,
                                                     int64_t local) {
  return local < chunk ? rank * chunk + local : (2 * cp - 1 - rank) * chunk + (local - chunk);
}

/// First position of the local half `half` (0: the early chunk, 1: the late one).
DHELIX_HOST_DEVICE inline int64_t cp_chunk_start(int64_t cp, int64_t rank, int64_t chunk,
                                                 int64_t half) {
  return (half == 0 ? rank : 2 * cp - 1 - rank) * chunk;
}

/// Keys of a chunk starting at `key_start` (of `chunk` keys, ascending positions) that a
/// query at `position` sees under the causal mask: the first min(chunk, position -
/// key_start + 1) keys, or none.
DHELIX_HOST_DEVICE inline int64_t visible_keys(int64_t position, int64_t key_start, int64_t chunk) {
  int64_t n = position - key_start + 1;
  if (n < 0) n = 0;
  return n < chunk ? n : chunk;
}

/// Queries of a chunk starting at `query_start` (of `chunk` queries) that see a key at
/// `key_position`: the last ones, from local index first_seeing_query(...) on.
DHELIX_HOST_DEVICE inline int64_t first_seeing_query(int64_t key_position, int64_t query_start,
                                                     int64_t chunk) {
  int64_t first = key_position - query_start;
  if (first < 0) first = 0;
  return first < chunk ? first : chunk;
}

/// Of the keys [tile_start, tile_start + tile_keys) of a chunk, how many a query that sees
/// the chunk's first `visible` keys folds: min(tile_keys, visible - tile_start), or 0. The
/// forward and the dq pass walk a chunk's keys in tiles from its start, so both backends
/// fold the same keys per tile (the CUDA kernels stage each tile once per thread block).
DHELIX_HOST_DEVICE inline int64_t keys_in_tile(int64_t visible, int64_t tile_start,
                                               int64_t tile_keys) {
  const int64_t n = visible - tile_start;
  if (n <= 0) return 0;
  return n < tile_keys ? n : tile_keys;
}

/// Of the queries [tile_start, tile_start + staged) of a chunk, the offset within the tile
/// of the first one that sees a key whose first seeing query is `first`
/// (first_seeing_query): max(first - tile_start, 0), or `staged` when none in the tile
/// does. The dk/dv pass adds the queries [offset, staged) of each tile, ascending.
DHELIX_HOST_DEVICE inline int64_t first_query_in_tile(int64_t first, int64_t tile_start,
                                                      int64_t staged) {
  const int64_t offset = first - tile_start;
  if (offset <= 0) return 0;
  return offset < staged ? offset : staged;
}

}  // namespace dhelix::kernels
