// The host twin of runtime/cuda/kernels_moe_route.cu: the router's kernels as loops, each
// loop one kernel, its body what one warp (per token), block (per tile) or thread does,
// in the same order, so that the parallel decomposition of runtime/kernels/moe_route_scan.h
// is checked on values without a GPU (tests/runtime/moe_route_scan_test.cc compares it
// with the serial reference functions).

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/moe_padded_cpu.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_route_scan.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::cpu {
namespace {

using kernels::kMoeScanTile;
using kernels::kReduceLanes;
using kernels::MoePaddedRouting;
using kernels::MoePaddedShape;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

// moe_topk_kernel's slot j for one token: each lane's best untaken expert among e = lane,
// lane + 32, ..., then the warp's xor-shuffle combine of the 32 candidates.
int32_t warp_topk_pick(int64_t experts, const float* z, const std::vector<bool>& taken) {
  float value[kReduceLanes];
  int64_t index[kReduceLanes];
  for (int lane = 0; lane < kReduceLanes; ++lane) {
    index[lane] = -1;
    value[lane] = 0.0f;
    for (int64_t e = lane; e < experts; e += kReduceLanes) {
      if (!taken[to_size(e)] && kernels::router_ranks_before(z[e], e, value[lane], index[lane])) {
        value[lane] = z[e];
        index[lane] = e;
      }
    }
  }
  for (int offset = kReduceLanes / 2; offset > 0; offset /= 2) {
    float next_value[kReduceLanes];
    int64_t next_index[kReduceLanes];
    for (int lane = 0; lane < kReduceLanes; ++lane) {
      const int other = lane ^ offset;
      const bool take =
          kernels::router_ranks_before(value[other], index[other], value[lane], index[lane]);
      next_value[lane] = take ? value[other] : value[lane];
      next_index[lane] = take ? index[other] : index[lane];
    }
    std::copy_n(next_value, kReduceLanes, value);
    std::copy_n(next_index, kReduceLanes, index);
  }
  return static_cast<int32_t>(index[0]);
}

// moe_topk_kernel for token row z: top-k, their gates, the full softmax (lane-tree sum).
void topk_token(const MoePaddedShape& s, const float* z, int32_t* chosen, float* gate,
                float* probs) {
  std::vector<bool> taken(to_size(s.experts), false);
  for (int64_t j = 0; j < s.top_k; ++j) {
    chosen[j] = warp_topk_pick(s.experts, z, taken);
    taken[to_size(chosen[j])] = true;
  }
  kernels::router_topk_gates(
      s.top_k, [z](int64_t e) { return z[e]; }, chosen, gate);
  float m = z[0];
  for (int64_t e = 1; e < s.experts; ++e) m = kernels::max_float(m, z[e]);
  const float sum =
      kernels::lane_tree_sum(s.experts, [z, m](int64_t e) { return std::exp(z[e] - m); });
  for (int64_t e = 0; e < s.experts; ++e) probs[e] = kernels::router_softmax_value(z[e], m, sum);
}

// Whether assignment a takes part in a counting pass: every one, or the kept ones.
bool counted(const uint8_t* kept, int64_t a) { return kept == nullptr || kept[a] != 0; }

// moe_tile_counts_kernel: counts[e * tiles + tile] of the counted assignments.
void tile_counts(int64_t n, int64_t experts, const int32_t* chosen, const uint8_t* kept,
                 std::vector<int32_t>& counts) {
  const int64_t tiles = kernels::moe_scan_tiles(n);
  counts.assign(to_size(experts * tiles), 0);
  for (int64_t a = 0; a < n; ++a) {
    if (counted(kept, a)) ++counts[to_size(chosen[a] * tiles + a / kMoeScanTile)];
  }
}

// moe_tile_scan_kernel: each expert's row to its exclusive scan; returns the totals.
std::vector<int64_t> scan_tiles(int64_t experts, int64_t tiles, std::vector<int32_t>& counts) {
  std::vector<int64_t> totals(to_size(experts));
  for (int64_t e = 0; e < experts; ++e) {
    int64_t running = 0;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int32_t here = counts[to_size(e * tiles + tile)];
      counts[to_size(e * tiles + tile)] = static_cast<int32_t>(running);
      running += here;
    }
    totals[to_size(e)] = running;
  }
  return totals;
}

// moe_tile_rows_kernel: per tile, the kept assignments' rows from the scanned offsets and
// their ranks in the tile, -1 for the dropped.
void tile_rows(const MoePaddedShape& s, const MoePaddedRouting& r,
               const std::vector<int32_t>& offsets) {
  const int64_t n = s.tokens * s.top_k, tiles = kernels::moe_scan_tiles(n);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    std::vector<int64_t> rank(to_size(s.experts), 0);
    for (int64_t a = tile * kMoeScanTile; a < std::min(n, (tile + 1) * kMoeScanTile); ++a) {
      if (!counted(r.kept, a)) {
        r.row[a] = -1;
        continue;
      }
      const int64_t e = r.chosen[a];
      r.row[a] = kernels::moe_padded_row_of(e, s.capacity, offsets[to_size(e * tiles + tile)],
                                            rank[to_size(e)]++);
    }
  }
}

// moe_aux_partial_kernel and moe_aux_final_kernel.
float aux_loss(const MoePaddedShape& s, const float* probs, const int64_t* routed) {
  const int64_t items = s.tokens * s.experts, blocks = kernels::moe_aux_blocks(s.tokens, s.experts);
  std::vector<double> partials(to_size(blocks)), threads(to_size(kernels::kMoeAuxThreads));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < kernels::kMoeAuxThreads; ++j) {
      threads[to_size(j)] = kernels::moe_aux_thread_partial(b, j, items, s.experts, probs, routed);
    }
    partials[to_size(b)] = kernels::tree_sum_pow2(threads.data(), kernels::kMoeAuxThreads);
  }
  for (int64_t j = 0; j < kernels::kMoeAuxThreads; ++j) {
    threads[to_size(j)] = kernels::moe_aux_final_partial(j, blocks, partials.data());
  }
  const double sum = kernels::tree_sum_pow2(threads.data(), kernels::kMoeAuxThreads);
  return kernels::moe_aux_loss_of_sum(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, sum);
}

}  // namespace

void moe_route(const MoePaddedShape& s, const float* logits, MoePaddedRouting r) {
  check_moe_shape(s);
  const int64_t n = s.tokens * s.top_k, tiles = kernels::moe_scan_tiles(n);
  for (int64_t t = 0; t < s.tokens; ++t) {
    topk_token(s, logits + t * s.experts, r.chosen + t * s.top_k, r.gate + t * s.top_k,
               r.probs + t * s.experts);
  }
  // n_e: every assignment counted, scanned; the totals only.
  std::vector<int32_t> counts;
  tile_counts(n, s.experts, r.chosen, nullptr, counts);
  const std::vector<int64_t> routed = scan_tiles(s.experts, tiles, counts);
  std::copy(routed.begin(), routed.end(), r.routed);
  // moe_keep_kernel: per assignment, after every n_e is written.
  for (int64_t a = 0; a < n; ++a) {
    r.kept[a] = kernels::keeps_assignment(n, r.chosen, r.gate, r.routed, s.capacity, a) ? 1 : 0;
  }
  // The kept ones: counted, scanned, placed.
  tile_counts(n, s.experts, r.chosen, r.kept, counts);
  const std::vector<int64_t> kept = scan_tiles(s.experts, tiles, counts);
  for (int64_t e = 0; e < s.experts; ++e) r.send_counts[e] = kept[to_size(e)] * s.hidden;
  tile_rows(s, r, counts);
  *r.aux_loss = aux_loss(s, r.probs, r.routed);
}

void moe_router_logits_backward(const MoePaddedShape& s, MoePaddedRouting r, const float* dgate,
                                float aux_dloss, float* dz) {
  const bool aux = s.aux_loss_coeff > 0.0 && aux_dloss != 0.0f;
  auto dp = [&s, &r, aux_dloss](int64_t e) {
    return kernels::load_balancing_gradient_at(s.tokens, s.top_k, s.experts, s.aux_loss_coeff,
                                               r.routed[e], aux_dloss);
  };
  // moe_router_grad_kernel: a warp per token, the aux inner product in lane-tree order.
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* p = r.probs + t * s.experts;
    const int32_t* chosen = r.chosen + t * s.top_k;
    const float* gate = r.gate + t * s.top_k;
    const float* dg = dgate + t * s.top_k;
    const float aux_inner =
        aux ? kernels::lane_tree_sum(s.experts, [p, &dp](int64_t e) { return p[e] * dp(e); })
            : 0.0f;
    const float gate_inner = kernels::router_gate_inner(s.top_k, gate, dg);
    for (int64_t e = 0; e < s.experts; ++e) {
      dz[t * s.experts + e] = kernels::router_backward_element(
          e, s.top_k, chosen, gate, dg, p[e], aux, aux ? dp(e) : 0.0f, aux_inner, gate_inner);
    }
  }
}

}  // namespace dhelix::cpu
