#pragma once
// What the tensor-core attention kernels (attention_tc.h) share: the kernel argument, the
// positions of a range of local tokens, fragment loads from global memory and the K/V tile
// staging. Device code only.

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <vector>

#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/launch_config.h"
#include "runtime/cuda/mma_bf16.cuh"
#include "runtime/kernels/attention.h"
#include "runtime/kernels/attention_layout.h"

namespace dhelix::cuda::tc {

using bf16 = __nv_bfloat16;
using kernels::AttentionShape;
using kernels::layout_position;
using kernels::TokenLayout;

inline constexpr int kSliceRows = 16;  ///< rows per warp: an mma's M
inline constexpr int kTileKeys = 64;   ///< keys (queries) per partner tile
inline constexpr int kBlockWarps = 4;  ///< warps of a forward / dq block

/// Everything a kernel reads and writes; unused pointers stay null.
struct Args {
  AttentionShape shape;
  kernels::AttentionLayouts layouts;
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  const bf16* dout = nullptr;
  const float* lse = nullptr;
  const float* delta = nullptr;
  bf16* out = nullptr;
  float* lse_out = nullptr;
  float* stats = nullptr;  ///< ring state: (max, sum) per row
  float* acc = nullptr;    ///< ring state: unnormalised output
  bf16* dq = nullptr;
  bf16* dk = nullptr;
  bf16* dv = nullptr;
  bool ring = false;  ///< a ring step: state in and out, gradients accumulated unscaled
};

/// Element d of head h at local token t of sequence b in a [batch, seq, heads, hd] tensor.
__device__ inline int64_t at(const AttentionShape& s, int64_t b, int64_t t, int64_t h,
                             int64_t heads, int64_t d) {
  return ((b * s.seq + t) * heads + h) * s.head_dim + d;
}

/// Row (b, h, t) of a [batch, heads, seq] statistic.
__device__ inline int64_t stat(const AttentionShape& s, int64_t b, int64_t h, int64_t t) {
  return (b * s.heads + h) * s.seq + t;
}

/// Latest position among local tokens [begin, end) (end <= count): each run ascends, so it
/// is the last token of one of the two runs the range touches; -1 for an empty range.
__device__ inline int64_t latest_position(const TokenLayout& l, int64_t begin, int64_t end) {
  int64_t latest = -1;
  if (begin >= end) return latest;
  if (begin < l.part) latest = layout_position(l, (end < l.part ? end : l.part) - 1);
  if (end > l.part) {
    const int64_t last = layout_position(l, end - 1);
    latest = last > latest ? last : latest;
  }
  return latest;
}

/// Earliest position among local tokens [begin, end): the first token of a run it touches.
__device__ inline int64_t earliest_position(const TokenLayout& l, int64_t begin, int64_t end) {
  int64_t earliest = INT64_MAX;
  if (begin >= end) return earliest;
  if (begin < l.part) earliest = layout_position(l, begin);
  if (end > l.part) {
    const int64_t first = layout_position(l, begin > l.part ? begin : l.part);
    earliest = first < earliest ? first : earliest;
  }
  return earliest;
}

/// Elements d, d + 1 of row t (head h of `heads`) as one register; zeros past the sequence
/// or the head dimension (the padding of the head dimension to a multiple of 16).
__device__ inline uint32_t load_pair(const AttentionShape& s, const bf16* x, int64_t b, int64_t t,
                                     int64_t h, int64_t heads, int64_t d) {
  if (t >= s.seq || d >= s.head_dim) return 0u;
  return *reinterpret_cast<const uint32_t*>(x + at(s, b, t, h, heads, d));
}

/// The A operand of rows (r0, r0 + 8) and columns [16 kt, 16 kt + 16) of a token tensor.
__device__ inline void load_a(const AttentionShape& s, const bf16* x, int64_t b, int64_t r0,
                              int64_t h, int64_t heads, int kt, uint32_t (&a)[4]) {
  const int64_t col = 16 * kt + 2 * mma::lane_pair();
  a[0] = load_pair(s, x, b, r0, h, heads, col);
  a[1] = load_pair(s, x, b, r0 + 8, h, heads, col);
  a[2] = load_pair(s, x, b, r0, h, heads, col + 8);
  a[3] = load_pair(s, x, b, r0 + 8, h, heads, col + 8);
}

/// Stages tokens [first, first + count) of head h of x into tile[kTileKeys][stride] (bf16,
/// stride = padded head dimension + 8 against bank conflicts), zeros elsewhere; all the
/// block's threads take part.
__device__ inline void stage_tile(const AttentionShape& s, const bf16* x, int64_t b, int64_t first,
                                  int64_t count, int64_t h, int64_t heads, int dims, int stride,
                                  bf16* tile) {
  const int pairs = dims / 2;
  for (int idx = static_cast<int>(threadIdx.x); idx < kTileKeys * pairs;
       idx += static_cast<int>(blockDim.x)) {
    const int row = idx / pairs, d = 2 * (idx % pairs);
    const uint32_t value = row < count ? load_pair(s, x, b, first + row, h, heads, d) : 0u;
    *reinterpret_cast<uint32_t*>(tile + row * stride + d) = value;
  }
}

/// B operand for S = X T^T from a staged tile T[key][d]: keys 8 nt .. 8 nt + 7 (n),
/// dimensions [16 kt, 16 kt + 16) (k): consecutive dimensions of one key, one 32-bit load.
__device__ inline void tile_b_rows(const bf16* tile, int stride, int nt, int kt, uint32_t& b0,
                                   uint32_t& b1) {
  const bf16* p = tile + (8 * nt + mma::lane_group()) * stride + 16 * kt + 2 * mma::lane_pair();
  b0 = *reinterpret_cast<const uint32_t*>(p);
  b1 = *reinterpret_cast<const uint32_t*>(p + 8);
}

/// B operand for O += P T from a staged tile T[key][d]: keys [16 j, 16 j + 16) (k),
/// dimensions 8 dt .. 8 dt + 7 (n): two keys of one dimension per register.
__device__ inline void tile_b_cols(const bf16* tile, int stride, int j, int dt, uint32_t& b0,
                                   uint32_t& b1) {
  const int key = 16 * j + 2 * mma::lane_pair(), col = 8 * dt + mma::lane_group();
  b0 = mma::pack(tile[key * stride + col], tile[(key + 1) * stride + col]);
  b1 = mma::pack(tile[(key + 8) * stride + col], tile[(key + 9) * stride + col]);
}

/// Calls f(std::integral_constant<int, D>{}) with D the kernels' instance for head_dim
/// (launch_config.h's tc_dim_tiles: 2, 4, 8 or 16 tiles of 16), so that each launch names
/// its kernel template once.
template <class F>
void with_dim_tiles(int64_t head_dim, F&& f) {
  switch (tc_dim_tiles(head_dim)) {
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    default:
      f(std::integral_constant<int, 16>{});
      break;
  }
}

/// Between the two kernel files: the argument check (a layout's runs inside the shape, whole
/// GQA groups), the dk/dv launch and its kernels.
void check_args(const Args& a);
void launch_dkdv(const Args& a, cudaStream_t stream);
std::vector<KernelEntry> dkdv_kernels();

}  // namespace dhelix::cuda::tc
