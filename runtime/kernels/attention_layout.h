#pragma once
// Where a block of tokens sits in the sequence: the one mask description the tensor-core
// attention kernels (runtime/cuda/attention_tc.h) and their host twin
// (runtime/cpu/attention_tc_twin.h) share for plain causal attention and for every
// ring step of context parallelism.
//
// A block of `count` local tokens is at most two runs of consecutive positions: local
// tokens [0, part) at positions start0.., tokens [part, count) at start1... Query i sees
// key j when position(j) <= position(i), the causal mask, which is exactly what
// kernels::visible_keys and first_seeing_query (context_parallel.h) say chunk by chunk.
//
//   plain causal, seq 5:          part 5, start0 0          positions 0 1 2 3 4
//   CP 2, rank 0, chunk 2:        part 2, start0 0, start1 6    positions 0 1 6 7
//   CP 2, block of rank 1:        part 2, start0 2, start1 4    positions 2 3 4 5
//
// The kernels tile each run separately (key tiles start at a run's first token), so a
// tile's positions ascend and its first key is its earliest one: a query slice skips a
// whole key tile when that key is later than the slice's latest query.

#include "runtime/kernels/context_parallel.h"
#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Positions of a block of local tokens: two ascending runs (see the header comment).
struct TokenLayout {
  int64_t part = 0;    ///< tokens in the first run
  int64_t start0 = 0;  ///< position of local token 0
  int64_t start1 = 0;  ///< position of local token `part`
};

/// Global position of local token t.
DHELIX_HOST_DEVICE inline int64_t layout_position(const TokenLayout& layout, int64_t t) {
  return t < layout.part ? layout.start0 + t : layout.start1 + (t - layout.part);
}

/// Where the queries and the keys of one attention call (or ring step) sit.
struct AttentionLayouts {
  TokenLayout queries;
  TokenLayout keys;
};

/// Plain causal attention over `seq` tokens: one run from position 0.
inline TokenLayout causal_layout(int64_t seq) { return {.part = seq, .start0 = 0, .start1 = seq}; }

/// The 2·chunk local tokens of CP rank `rank` of `cp` (its chunks rank and 2·cp - 1 - rank),
/// for its queries or for the K/V block it sends around the ring.
inline TokenLayout cp_layout(int64_t cp, int64_t rank, int64_t chunk) {
  return {.part = chunk,
          .start0 = cp_chunk_start(cp, rank, chunk, 0),
          .start1 = cp_chunk_start(cp, rank, chunk, 1)};
}

}  // namespace dhelix::kernels
