#pragma once
// A context-parallel rank's local rows of a whole-sequence tensor, for the ring attention
// tests (ring_attention_test.cc, attention_tc_twin_test.cc): rank `rank` of `cp` holds
// chunks rank and 2·cp - 1 - rank of c = seq / (2·cp) rows each
// (kernels::cp_global_position).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/kernels/context_parallel.h"

namespace dhelix::test {

/// Rank `rank`'s local tensor [batch, 2c, width] gathered from a full [batch, seq, width].
template <class T>
std::vector<T> local_rows(const std::vector<T>& full, int64_t batch, int64_t seq, int64_t width,
                          int64_t cp, int64_t rank) {
  const int64_t c = seq / (2 * cp);
  std::vector<T> out(static_cast<size_t>(batch * 2 * c * width));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < 2 * c; ++i) {
      const int64_t p = kernels::cp_global_position(cp, rank, c, i);
      std::copy_n(full.begin() + (b * seq + p) * width, width,
                  out.begin() + (b * 2 * c + i) * width);
    }
  }
  return out;
}

}  // namespace dhelix::test
