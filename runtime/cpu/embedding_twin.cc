// The host twin of runtime/cuda/kernels_embedding.cu (embedding_twin.h): each loop one
// kernel, in the kernels' order.

#include "runtime/cpu/embedding_twin.h"

#include <algorithm>
#include <utility>

#include "runtime/kernels/embedding.h"
#include "runtime/kernels/moe_route_scan.h"

namespace dhelix::cpu {
namespace {

constexpr int kRadixBits = 8;
constexpr int64_t kRadixBuckets = int64_t{1} << kRadixBits;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

int64_t digit_of(uint32_t key, int shift) {
  return static_cast<int64_t>((key >> shift) & (kRadixBuckets - 1));
}

// One pass: radix_counts_kernel, radix_scan_kernel, radix_bases_kernel and
// radix_scatter_kernel on the digit at `shift`.
void radix_pass(int shift, EmbeddingSortedPositions& from, EmbeddingSortedPositions& to) {
  const int64_t n = static_cast<int64_t>(from.sorted_keys.size());
  const int64_t tiles = kernels::moe_scan_tiles(n), tile_size = kernels::kMoeScanTile;
  std::vector<int64_t> offsets(to_size(kRadixBuckets * tiles), 0), bases(to_size(kRadixBuckets));
  for (int64_t i = 0; i < n; ++i) {
    ++offsets[to_size(digit_of(from.sorted_keys[to_size(i)], shift) * tiles + i / tile_size)];
  }
  for (int64_t d = 0; d < kRadixBuckets; ++d) {
    int64_t running = 0;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t here = offsets[to_size(d * tiles + tile)];
      offsets[to_size(d * tiles + tile)] = running;
      running += here;
    }
    bases[to_size(d)] = running;  // the digit's total, scanned below
  }
  int64_t base = 0;  // the digits' totals to their exclusive scan
  for (int64_t d = 0; d < kRadixBuckets; ++d) {
    const int64_t total = bases[to_size(d)];
    bases[to_size(d)] = base;
    base += total;
  }
  for (int64_t tile = 0; tile < tiles; ++tile) {
    std::vector<int64_t> rank(to_size(kRadixBuckets), 0);
    for (int64_t i = tile * tile_size; i < std::min(n, (tile + 1) * tile_size); ++i) {
      const int64_t d = digit_of(from.sorted_keys[to_size(i)], shift);
      const int64_t at =
          bases[to_size(d)] + offsets[to_size(d * tiles + tile)] + rank[to_size(d)]++;
      to.sorted_keys[to_size(at)] = from.sorted_keys[to_size(i)];
      to.order[to_size(at)] = from.order[to_size(i)];
    }
  }
}

}  // namespace

EmbeddingSortedPositions embedding_radix_sort(int64_t positions, const int64_t* tokens,
                                              int64_t vocab_begin, int64_t vocab_local) {
  EmbeddingSortedPositions sorted, spare;
  for (int64_t r = 0; r < positions; ++r) {  // embedding_keys_kernel
    sorted.sorted_keys.push_back(kernels::embedding_sort_key(tokens[r], vocab_begin, vocab_local));
    sorted.order.push_back(static_cast<int32_t>(r));
  }
  spare = sorted;
  for (int shift = 0; shift < kernels::embedding_key_bits(vocab_local); shift += kRadixBits) {
    radix_pass(shift, sorted, spare);
    std::swap(sorted, spare);
  }
  return sorted;
}

void embedding_backward_sorted(int64_t positions, int64_t dim, const int64_t* tokens,
                               const float* dout, int64_t vocab_begin, int64_t vocab_local,
                               float* dtable) {
  const EmbeddingSortedPositions s =
      embedding_radix_sort(positions, tokens, vocab_begin, vocab_local);
  // embedding_scatter_kernel: a thread per (sorted index, column).
  for (int64_t i = 0; i < positions; ++i) {
    if (!kernels::embedding_run_starts(i, s.sorted_keys.data())) continue;
    for (int64_t col = 0; col < dim; ++col) {
      float* cell = dtable + static_cast<int64_t>(s.sorted_keys[to_size(i)] - 1) * dim + col;
      *cell = kernels::embedding_run_column_sum(
          i, positions, s.sorted_keys.data(), s.order.data(), col, *cell,
          [dout, dim](int64_t p, int64_t c) { return dout[p * dim + c]; });
    }
  }
}

}  // namespace dhelix::cpu
