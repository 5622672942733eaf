#include "planner/chunk_pairing.h"

#include <algorithm>
#include <vector>

#include "lib/error.h"

namespace dhelix {

namespace {

StrandGraph repeat(const StrandGraph& layer, int64_t times) {
  return concatenate_layers(std::vector<StrandGraph>(static_cast<size_t>(times), layer));
}

PairingResult search_window(const StrandGraph& f, const StrandGraph& b, const CoRunModel& model,
                            int64_t layers, const PairingOptions& options) {
  const StrandGraph fw = repeat(f, layers);
  const StrandGraph bw = repeat(b, layers);
  // Layers repeat: a block shifted by whole layers costs the same, so it is simulated once.
  const BlockCostModel cost(fw, bw, model, LayerPeriods{f.size(), b.size()},
                            options.paired_block_gap_us);
  return search_pairing(cost, options);
}

// search_window through the memo when there is one.
PairingResult window_result(const StrandGraph& f, const StrandGraph& b, const CoRunModel& model,
                            int64_t layers, const PairingOptions& options, PairingMemo* memo) {
  if (memo == nullptr) return search_window(f, b, model, layers, options);
  return memo->find_or_search(pairing_memo_key(MemoSearch::kPairing, f, b, layers, options),
                              [&] { return search_window(f, b, model, layers, options); });
}

// The segment bound the work budget imposed on a search, 0 when it ran as asked.
int64_t tightened_bound(const PairingResult& result, const PairingOptions& asked) {
  return result.segment_bound != asked.max_segment_ops ? result.segment_bound : 0;
}

}  // namespace

ChunkPairingResult search_chunk_pairing(const StrandGraph& forward_layer,
                                        const StrandGraph& backward_layer, const CoRunModel& model,
                                        const ChunkPairingOptions& options) {
  DHELIX_CHECK(options.num_layers >= 1);
  ChunkPairingResult result;
  if (options.memo == nullptr) {
    result.per_layer = search_pairing(BlockCostModel(forward_layer, backward_layer, model, {},
                                                     options.per_layer.paired_block_gap_us),
                                      options.per_layer);
  } else {
    result.per_layer = options.memo->find_or_search(
        pairing_memo_key(MemoSearch::kPairing, forward_layer, backward_layer, 1, options.per_layer),
        [&] {
          return search_pairing(BlockCostModel(forward_layer, backward_layer, model, {},
                                               options.per_layer.paired_block_gap_us),
                                options.per_layer);
        });
  }
  const double layers = static_cast<double>(options.num_layers);
  result.per_layer_chunk_us = layers * result.per_layer.total_time_us;
  result.sequential_chunk_us = layers * result.per_layer.sequential_time_us;

  const int64_t widest = std::max<int64_t>({forward_layer.size(), backward_layer.size(), 1});
  int64_t window = std::min(options.num_layers, kMaxStrandOps / widest);
  if (options.max_window_layers > 0) window = std::min(window, options.max_window_layers);
  result.window_layers = std::max<int64_t>(window, 1);
  result.cross_layer_chunk_us = result.per_layer_chunk_us;
  if (window >= 2) {
    result.cross_window = window_result(forward_layer, backward_layer, model, window,
                                        options.cross_layer, options.memo);
    const int64_t remainder = options.num_layers % window;
    double total =
        static_cast<double>(options.num_layers / window) * result.cross_window.total_time_us;
    if (remainder > 0) {
      result.cross_remainder = window_result(forward_layer, backward_layer, model, remainder,
                                             options.cross_layer, options.memo);
      total += result.cross_remainder.total_time_us;
    }
    result.cross_layer_chunk_us = total;
  }
  result.layer_segment_bound = tightened_bound(result.per_layer, options.per_layer);
  for (const PairingResult* r : {&result.cross_window, &result.cross_remainder}) {
    const int64_t bound = r->blocks.empty() ? 0 : tightened_bound(*r, options.cross_layer);
    if (bound > 0 && (result.window_segment_bound == 0 || bound < result.window_segment_bound)) {
      result.window_segment_bound = bound;
    }
  }
  result.cross_layer_better = result.cross_layer_chunk_us < result.per_layer_chunk_us;
  result.best_chunk_us = std::min(result.cross_layer_chunk_us, result.per_layer_chunk_us);
  return result;
}

}  // namespace dhelix
