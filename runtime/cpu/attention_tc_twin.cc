#include "runtime/cpu/attention_tc_twin.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/error.h"

namespace dhelix::cpu {
namespace {

using kernels::AttentionShape;
using kernels::layout_position;
using kernels::TokenLayout;

void check_shape(const AttentionShape& shape, const kernels::AttentionLayouts& layouts) {
  DHELIX_CHECK(shape.kv_heads >= 1 && shape.heads % shape.kv_heads == 0);
  DHELIX_CHECK(layouts.queries.part >= 0 && layouts.queries.part <= shape.seq);
  DHELIX_CHECK(layouts.keys.part >= 0 && layouts.keys.part <= shape.seq);
}

float dot(int64_t n, const float* a, const float* b) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The two runs of a layout as local token ranges [begin, end).
struct Run {
  int64_t begin = 0;
  int64_t end = 0;
};
std::vector<Run> runs(const TokenLayout& layout, int64_t seq) {
  return {{0, layout.part}, {layout.part, seq}};
}

// The latest position among local tokens [first, first + count) that exist: what a query
// slice's skip test compares a key tile's first position with.
int64_t latest_position(const TokenLayout& layout, int64_t first, int64_t count, int64_t seq) {
  int64_t latest = -1;
  for (int64_t t = first; t < std::min(first + count, seq); ++t) {
    latest = std::max(latest, layout_position(layout, t));
  }
  return latest;
}

// Calls visit(tile_begin, tile_end) for each key tile a query slice [first, first + 16)
// needs: 64 keys from each run's start, stopping in a run at the first tile whose first
// key comes after the slice's latest query (a run's positions ascend).
template <class Visit>
void for_each_key_tile(const AttentionShape& shape, const kernels::AttentionLayouts& layouts,
                       int64_t first, Visit visit) {
  const int64_t latest = latest_position(layouts.queries, first, kTcSliceRows, shape.seq);
  for (const Run& run : runs(layouts.keys, shape.seq)) {
    for (int64_t t = run.begin; t < run.end; t += kTcTileKeys) {
      if (layout_position(layouts.keys, t) > latest) break;
      visit(t, std::min(t + kTcTileKeys, run.end));
    }
  }
}

// Offsets of row t of head h in [batch, seq, heads, d] and [batch, heads, seq].
struct Index {
  const AttentionShape& shape;
  int64_t b;
  int64_t row(int64_t t, int64_t h, int64_t heads) const {
    return ((b * shape.seq + t) * heads + h) * shape.head_dim;
  }
  int64_t stat(int64_t t, int64_t h) const { return (b * shape.heads + h) * shape.seq + t; }
};

// One query row's fold of keys [begin, end) (the online-softmax step of a tile).
void forward_row_tile(const AttentionShape& shape, const kernels::AttentionLayouts& layouts,
                      const Index& at, int64_t i, int64_t h, int64_t begin, int64_t end,
                      const float* q, const float* k, const float* v, RingForwardState& state) {
  const int64_t d = shape.head_dim, kvh = h / (shape.heads / shape.kv_heads);
  const float scale = kernels::attention_scale(d);
  const int64_t position = layout_position(layouts.queries, i);
  float scores[kTcTileKeys];
  float tile_max = -INFINITY;
  for (int64_t j = begin; j < end; ++j) {
    const bool seen = layout_position(layouts.keys, j) <= position;
    const float s =
        seen ? dot(d, q + at.row(i, h, shape.heads), k + at.row(j, kvh, shape.kv_heads)) * scale
             : -INFINITY;
    scores[j - begin] = s;
    tile_max = std::max(tile_max, s);
  }
  kernels::OnlineSoftmaxState& s = state.rows[static_cast<size_t>(at.stat(i, h))];
  const float new_max = std::max(s.max_score, tile_max);
  // A row that has seen no key yet keeps max -inf; exp against 0 then gives 0, not NaN.
  const float use_max = new_max == -INFINITY ? 0.0f : new_max;
  const float correction = expf(s.max_score - use_max);
  float* acc = state.acc.data() + at.row(i, h, shape.heads);
  for (int64_t e = 0; e < d; ++e) acc[e] *= correction;
  float tile_sum = 0.0f;
  for (int64_t j = begin; j < end; ++j) {
    const float p = expf(scores[j - begin] - use_max);
    tile_sum += p;
    const float p16 = round_bf16(p);
    const float* vj = v + at.row(j, kvh, shape.kv_heads);
    for (int64_t e = 0; e < d; ++e) acc[e] += p16 * vj[e];
  }
  s.sum_exp = s.sum_exp * correction + tile_sum;
  s.max_score = new_max;
}

}  // namespace

float round_bf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u) {  // inf or NaN: keep (quiet a NaN)
    if ((bits & 0x007fffffu) != 0) bits |= 0x00400000u;
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  }
  bits &= 0xffff0000u;
  float rounded = 0.0f;
  std::memcpy(&rounded, &bits, sizeof rounded);
  return rounded;
}

void tc_twin_forward_step(const AttentionShape& shape, const kernels::AttentionLayouts& layouts,
                          const float* q, const float* k, const float* v, RingForwardState& state) {
  check_shape(shape, layouts);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const Index at{shape, b};
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t first = 0; first < shape.seq; first += kTcSliceRows) {
        for_each_key_tile(shape, layouts, first, [&](int64_t begin, int64_t end) {
          for (int64_t i = first; i < std::min(first + kTcSliceRows, shape.seq); ++i) {
            forward_row_tile(shape, layouts, at, i, h, begin, end, q, k, v, state);
          }
        });
      }
    }
  }
}

void tc_twin_backward_dq(const AttentionShape& shape, const kernels::AttentionLayouts& layouts,
                         const float* q, const float* dout, const float* lse, const float* delta,
                         const float* k, const float* v, float* dq_unscaled) {
  check_shape(shape, layouts);
  const int64_t d = shape.head_dim, group = shape.heads / shape.kv_heads;
  const float scale = kernels::attention_scale(d);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const Index at{shape, b};
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t first = 0; first < shape.seq; first += kTcSliceRows) {
        for_each_key_tile(shape, layouts, first, [&](int64_t begin, int64_t end) {
          for (int64_t i = first; i < std::min(first + kTcSliceRows, shape.seq); ++i) {
            const int64_t position = layout_position(layouts.queries, i);
            const float* qi = q + at.row(i, h, shape.heads);
            const float* di = dout + at.row(i, h, shape.heads);
            float* acc = dq_unscaled + at.row(i, h, shape.heads);
            for (int64_t j = begin; j < end; ++j) {
              if (layout_position(layouts.keys, j) > position) continue;  // p = ds = 0
              const float* kj = k + at.row(j, h / group, shape.kv_heads);
              const float* vj = v + at.row(j, h / group, shape.kv_heads);
              const float p = expf(dot(d, qi, kj) * scale - lse[at.stat(i, h)]);
              const float ds = round_bf16(p * (dot(d, di, vj) - delta[at.stat(i, h)]));
              for (int64_t e = 0; e < d; ++e) acc[e] += ds * kj[e];
            }
          }
        });
      }
    }
  }
}

void tc_twin_backward_dkdv(const AttentionShape& shape, const kernels::AttentionLayouts& layouts,
                           const float* q, const float* dout, const float* lse, const float* delta,
                           const float* k, const float* v, float* dk_unscaled, float* dv) {
  check_shape(shape, layouts);
  const int64_t d = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int64_t warps = std::min(group, kTcMaxGroupWarps);
  const float scale = kernels::attention_scale(d);
  // Per warp, the partial dk and dv of one 16-key slice: [warp][key in slice][d].
  std::vector<float> part_dk(static_cast<size_t>(warps * kTcSliceRows * d));
  std::vector<float> part_dv(part_dk.size());
  for (int64_t b = 0; b < shape.batch; ++b) {
    const Index at{shape, b};
    for (int64_t kvh = 0; kvh < shape.kv_heads; ++kvh) {
      for (int64_t first = 0; first < shape.seq; first += kTcSliceRows) {
        const int64_t last = std::min(first + kTcSliceRows, shape.seq);
        int64_t earliest = INT64_MAX;
        for (int64_t j = first; j < last; ++j) {
          earliest = std::min(earliest, layout_position(layouts.keys, j));
        }
        std::fill(part_dk.begin(), part_dk.end(), 0.0f);
        std::fill(part_dv.begin(), part_dv.end(), 0.0f);
        for (int64_t w = 0; w < warps; ++w) {
          for (int64_t g = w; g < group; g += warps) {
            const int64_t h = kvh * group + g;
            for (const Run& run : runs(layouts.queries, shape.seq)) {
              for (int64_t t = run.begin; t < run.end; t += kTcDkdvQueryTile) {
                const int64_t end = std::min(t + kTcDkdvQueryTile, run.end);
                // Skip a tile whose latest query is before every key of the slice.
                if (layout_position(layouts.queries, end - 1) < earliest) continue;
                for (int64_t j = first; j < last; ++j) {
                  const int64_t key_position = layout_position(layouts.keys, j);
                  const float* kj = k + at.row(j, kvh, shape.kv_heads);
                  const float* vj = v + at.row(j, kvh, shape.kv_heads);
                  float* pdk = part_dk.data() + (w * kTcSliceRows + (j - first)) * d;
                  float* pdv = part_dv.data() + (w * kTcSliceRows + (j - first)) * d;
                  for (int64_t i = t; i < end; ++i) {
                    if (layout_position(layouts.queries, i) < key_position) continue;
                    const float* qi = q + at.row(i, h, shape.heads);
                    const float* di = dout + at.row(i, h, shape.heads);
                    const float p = expf(dot(d, kj, qi) * scale - lse[at.stat(i, h)]);
                    const float ds = p * (dot(d, vj, di) - delta[at.stat(i, h)]);
                    const float p16 = round_bf16(p), ds16 = round_bf16(ds);
                    for (int64_t e = 0; e < d; ++e) {
                      pdv[e] += p16 * di[e];
                      pdk[e] += ds16 * qi[e];
                    }
                  }
                }
              }
            }
          }
        }
        // The block's reduction: the warps' partial sums in ascending warp order.
        for (int64_t j = first; j < last; ++j) {
          float* dkj = dk_unscaled + at.row(j, kvh, shape.kv_heads);
          float* dvj = dv + at.row(j, kvh, shape.kv_heads);
          for (int64_t e = 0; e < d; ++e) {
            float sum_dk = 0.0f, sum_dv = 0.0f;
            for (int64_t w = 0; w < warps; ++w) {
              sum_dk += part_dk[static_cast<size_t>((w * kTcSliceRows + (j - first)) * d + e)];
              sum_dv += part_dv[static_cast<size_t>((w * kTcSliceRows + (j - first)) * d + e)];
            }
            dkj[e] += sum_dk;
            dvj[e] += sum_dv;
          }
        }
      }
    }
  }
}

}  // namespace dhelix::cpu
