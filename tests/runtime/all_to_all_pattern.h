#pragma once
// One all_to_all_v exchange whose every element names its sender, receiver, chunk and
// position, for the loopback (all_to_all_test.cc) and MPI (comm_test.cc) tests. Counts
// vary per (sender, receiver, chunk), zeros included, as the expert dispatch's do.

#include <cstdint>
#include <vector>

namespace dhelix::rt::test {

/// Elements member `from` sends member `to` in chunk `c`: 0, 1 or 2.
inline int64_t pattern_count(int64_t from, int64_t to, int64_t c) {
  return (from + 2 * to + c) % 3;
}

/// The i-th element of that chunk.
inline float pattern_value(int64_t from, int64_t to, int64_t c, int64_t i) {
  return static_cast<float>(from * 1000 + to * 100 + c * 10 + i);
}

/// Member `rank`'s input and send counts in a group of n with `chunks` chunks per block.
struct PatternSend {
  std::vector<float> data;
  std::vector<int64_t> counts;
};
inline PatternSend pattern_send(int64_t rank, int64_t n, int64_t chunks) {
  PatternSend send;
  for (int64_t to = 0; to < n; ++to) {
    for (int64_t c = 0; c < chunks; ++c) {
      send.counts.push_back(pattern_count(rank, to, c));
      for (int64_t i = 0; i < pattern_count(rank, to, c); ++i) {
        send.data.push_back(pattern_value(rank, to, c, i));
      }
    }
  }
  return send;
}

/// What member `rank` must receive: the data and the counts.
inline PatternSend pattern_expected(int64_t rank, int64_t n, int64_t chunks) {
  PatternSend got;
  for (int64_t from = 0; from < n; ++from) {
    for (int64_t c = 0; c < chunks; ++c) {
      got.counts.push_back(pattern_count(from, rank, c));
      for (int64_t i = 0; i < pattern_count(from, rank, c); ++i) {
        got.data.push_back(pattern_value(from, rank, c, i));
      }
    }
  }
  return got;
}

}  // namespace dhelix::rt::test
