#pragma once
// Pairing scope for a stage's chunk of identical layers: the paper's scope (one layer's
// forward against one layer's backward, repeated for every layer) and a cross-layer scope
// (a window of w layers of each strand concatenated, so that blocks may straddle layer
// boundaries, with segments bounded to keep the search small). Windows are searched
// exactly; a chunk of L layers is floor(L / w) windows plus one window of L mod w layers,
// with a barrier between windows, so the cross-layer figure is an achievable plan (an
// upper bound on the unrestricted cross-layer optimum). The better scope is kept; both
// are reported.

#include <cstdint>

#include "planner/pairing_memo.h"
#include "planner/pairing_search.h"

namespace dhelix {

/// Options of the chunk search.
struct ChunkPairingOptions {
  int64_t num_layers = 1;  ///< layers in the chunk, >= 1
  /// Search options of the one-layer scope (unbounded segments by default).
  PairingOptions per_layer;
  /// Search options of the cross-layer scope (segments of at most 8 ops by default).
  PairingOptions cross_layer = [] {
    PairingOptions o;
    o.max_segment_ops = 8;
    return o;
  }();
  /// Most layers per window; 0 = as many as fit in kMaxStrandOps ops on both strands.
  int64_t max_window_layers = 0;
  /// Where to look searches up and keep them (pairing_memo.h); nullptr: search every time.
  PairingMemo* memo = nullptr;
};

/// Both scopes' results for a chunk.
struct ChunkPairingResult {
  PairingResult per_layer;          ///< one layer against one layer
  double per_layer_chunk_us = 0;    ///< num_layers x per_layer.total_time_us
  int64_t window_layers = 0;        ///< w; 1 means no cross-layer search was possible
  PairingResult cross_window;       ///< w layers against w layers
  PairingResult cross_remainder;    ///< (L mod w) layers against as many; empty when 0
  double cross_layer_chunk_us = 0;  ///< floor(L/w) x window + remainder
  double sequential_chunk_us = 0;   ///< num_layers x per_layer.sequential_time_us
  bool cross_layer_better = false;  ///< cross_layer_chunk_us < per_layer_chunk_us
  double best_chunk_us = 0;         ///< the better of the two
  /// Segment bounds the searches' work budget imposed (pairing_search.h, 5.), 0 where the
  /// search ran as asked: the layer scope's, and the tightest of the chunk scope's windows.
  int64_t layer_segment_bound = 0;
  int64_t window_segment_bound = 0;
};

/// Searches both scopes. The strands are one layer each; DHELIX_CHECKs num_layers >= 1.
ChunkPairingResult search_chunk_pairing(const StrandGraph& forward_layer,
                                        const StrandGraph& backward_layer, const CoRunModel& model,
                                        const ChunkPairingOptions& options);

}  // namespace dhelix
