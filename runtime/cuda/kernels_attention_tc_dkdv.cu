// The dk/dv pass of the tensor-core attention (attention_tc.h).
//
// A block owns 16 key rows of one KV head (blockIdx.x, y) of one sequence (z) and has
// W = blockDim.x / 32 = min(group, 4) warps. Warp w takes the group's query heads
// g = w, w + W, ... and, per head, each run of the query layout in tiles of kQueryTile = 32
// queries from the run's first one, ascending, skipping a tile whose latest query comes
// before the block's earliest key. The block's 16 keys and values are staged in shared
// memory once. Per tile, with the warp's 16 keys as the M rows:
//   S^T = K Q^T, dP^T = V dout^T          (q and dout read as B operands from global memory,
//   P^T = exp(scale S^T - lse), masked     through L1: each warp reads another head's)
//   dS^T = P^T (dP^T - delta)
//   dV += P^T dout, dK += dS^T Q           (P^T, dS^T rounded to bf16 from registers)
// Then the warps' partial dK (then dV) go to shared memory and the block adds them in
// ascending warp order: a second pass instead of fp32 atomics, so the sum order is fixed
// and dhelix-run --verify stays bitwise (docs/kernels.md, Determinism). The host twin
// (runtime/cpu/attention_tc_twin.cc, tc_twin_backward_dkdv) has the same split and order.

#include <cuda_bf16.h>

#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/attention_tc_common.cuh"
#include "runtime/cuda/launch_util.cuh"

namespace dhelix::cuda {
namespace tc {
namespace {

// Queries per tile of the dk/dv pass: 32, half the forward's key tile, so that the scores
// and their gradients (2 x 16 floats per lane) leave registers for dK and dV. The order of
// additions does not depend on it (queries ascending either way).
constexpr int kQueryTile = 32;
constexpr int kQueryTiles8 = kQueryTile / 8;

// B operand for X T^T with T = tokens [t, t + 64) of a token tensor (query head h): tokens
// t + 8 nt + g (n), dimensions [16 kt, 16 kt + 16) (k). Zeros past `end`.
__device__ inline void global_b_rows(const AttentionShape& s, const bf16* x, int64_t b, int64_t t,
                                     int64_t end, int64_t h, int nt, int kt, uint32_t& b0,
                                     uint32_t& b1) {
  const int64_t token = t + 8 * nt + mma::lane_group();
  const int64_t d = 16 * kt + 2 * mma::lane_pair();
  b0 = token < end ? load_pair(s, x, b, token, h, s.heads, d) : 0u;
  b1 = token < end ? load_pair(s, x, b, token, h, s.heads, d + 8) : 0u;
}

// B operand for P T: tokens t + [16 j, 16 j + 16) (k), dimensions 8 dt .. 8 dt + 7 (n).
__device__ inline bf16 element(const AttentionShape& s, const bf16* x, int64_t b, int64_t token,
                               int64_t end, int64_t h, int64_t d) {
  return token < end && d < s.head_dim ? x[at(s, b, token, h, s.heads, d)] : __float2bfloat16(0.0f);
}
__device__ inline void global_b_cols(const AttentionShape& s, const bf16* x, int64_t b, int64_t t,
                                     int64_t end, int64_t h, int j, int dt, uint32_t& b0,
                                     uint32_t& b1) {
  const int64_t token = t + 16 * j + 2 * mma::lane_pair();
  const int64_t d = 8 * dt + mma::lane_group();
  b0 = mma::pack(element(s, x, b, token, end, h, d), element(s, x, b, token + 1, end, h, d));
  b1 = mma::pack(element(s, x, b, token + 8, end, h, d), element(s, x, b, token + 9, end, h, d));
}

// The A operand of the staged slice's 16 rows, dimensions [16 kt, 16 kt + 16).
__device__ inline void slice_a(const bf16* slice, int stride, int kt, uint32_t (&a)[4]) {
  const bf16* p = slice + mma::lane_group() * stride + 16 * kt + 2 * mma::lane_pair();
  a[0] = *reinterpret_cast<const uint32_t*>(p);
  a[1] = *reinterpret_cast<const uint32_t*>(p + 8 * stride);
  a[2] = *reinterpret_cast<const uint32_t*>(p + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(p + 8 * stride + 8);
}

template <int kDT>
__global__ void __launch_bounds__(128) tc_dkdv_kernel(Args a) {
  constexpr int kDims = 16 * kDT, kStride = kDims + 8, kOutTiles = 2 * kDT;
  extern __shared__ __align__(16) unsigned char shared[];
  // The block's 16 keys and values (bf16, shared by its warps), then [W][16][kDims] fp32
  // partial sums for the ordered reduction.
  bf16* k_slice = reinterpret_cast<bf16*>(shared);
  bf16* v_slice = k_slice + kSliceRows * kStride;
  float* partial = reinterpret_cast<float*>(v_slice + kSliceRows * kStride);
  const AttentionShape& s = a.shape;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, group = s.heads / s.kv_heads;
  const int warps = static_cast<int>(blockDim.x) / 32, w = static_cast<int>(threadIdx.x) / 32;
  const int c = mma::lane_pair(), g = mma::lane_group();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kSliceRows;
  const int64_t last = first + kSliceRows < s.seq ? first + kSliceRows : s.seq;
  const int64_t j0 = first + g;
  int64_t key_pos[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + 8 * r;
    key_pos[r] = j < s.seq ? layout_position(a.layouts.keys, j) : INT64_MAX;
  }
  const int64_t earliest = earliest_position(a.layouts.keys, first, last);
  const float scale = kernels::attention_scale(s.head_dim);

  // K and V are read as A operands from shared memory at each use: registers go to dK, dV.
  for (int idx = static_cast<int>(threadIdx.x); idx < kSliceRows * kDims / 2;
       idx += static_cast<int>(blockDim.x)) {
    const int row = idx / (kDims / 2), d = 2 * (idx % (kDims / 2));
    *reinterpret_cast<uint32_t*>(k_slice + row * kStride + d) =
        load_pair(s, a.k, b, first + row, kvh, s.kv_heads, d);
    *reinterpret_cast<uint32_t*>(v_slice + row * kStride + d) =
        load_pair(s, a.v, b, first + row, kvh, s.kv_heads, d);
  }
  __syncthreads();
  float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
  for (int dt = 0; dt < kOutTiles; ++dt) {
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  }

  const TokenLayout& queries = a.layouts.queries;
  for (int64_t gh = w; gh < group; gh += warps) {
    const int64_t h = kvh * group + gh;
    for (int run = 0; run < 2; ++run) {
      const int64_t begin = run == 0 ? 0 : queries.part, end = run == 0 ? queries.part : s.seq;
      for (int64_t t = begin; t < end; t += kQueryTile) {
        const int64_t tile_end = end - t < kQueryTile ? end : t + kQueryTile;
        if (layout_position(queries, tile_end - 1) < earliest) continue;
        float p[kQueryTiles8][4], dp[kQueryTiles8][4];
#pragma unroll
        for (int nt = 0; nt < kQueryTiles8; ++nt) {
          for (int e = 0; e < 4; ++e) p[nt][e] = dp[nt][e] = 0.0f;
            // Not unrolled: the compiler would hoist every load of the tile ahead of the
            // products and run out of registers (dK and dV hold 4 head_dim / 8 per lane).
#pragma unroll 1
          for (int kt = 0; kt < kDT; ++kt) {
            uint32_t b0, b1, x[4];
            global_b_rows(s, a.q, b, t, tile_end, h, nt, kt, b0, b1);
            slice_a(k_slice, kStride, kt, x);
            mma::mma_bf16(p[nt], x, b0, b1);
            global_b_rows(s, a.dout, b, t, tile_end, h, nt, kt, b0, b1);
            slice_a(v_slice, kStride, kt, x);
            mma::mma_bf16(dp[nt], x, b0, b1);
          }
        }
        // Column (query) 8 nt + 2c + (e & 1) of row (key) e / 2.
#pragma unroll
        for (int nt = 0; nt < kQueryTiles8; ++nt) {
#pragma unroll
          for (int e0 = 0; e0 < 2; ++e0) {
            const int64_t i = t + 8 * nt + 2 * c + e0;
            const bool real = i < tile_end;
            const int64_t qpos = real ? layout_position(queries, i) : -1;
            const float lse = real ? a.lse[stat(s, b, h, i)] : 0.0f;
            const float delta = real ? a.delta[stat(s, b, h, i)] : 0.0f;
            for (int r = 0; r < 2; ++r) {
              const int e = 2 * r + e0;
              const bool seen = real && key_pos[r] <= qpos;
              const float prob = seen ? expf(p[nt][e] * scale - lse) : 0.0f;
              dp[nt][e] = prob * (dp[nt][e] - delta);  // now dS^T
              p[nt][e] = prob;
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kQueryTile / 16; ++j) {
          uint32_t pa[4], dsa[4];
          mma::pack_a_from_c(p[2 * j], p[2 * j + 1], pa);
          mma::pack_a_from_c(dp[2 * j], dp[2 * j + 1], dsa);
#pragma unroll
          for (int dt = 0; dt < kOutTiles; ++dt) {
            uint32_t b0, b1;
            global_b_cols(s, a.dout, b, t, tile_end, h, j, dt, b0, b1);
            mma::mma_bf16(dv[dt], pa, b0, b1);
            global_b_cols(s, a.q, b, t, tile_end, h, j, dt, b0, b1);
            mma::mma_bf16(dk[dt], dsa, b0, b1);
          }
        }
      }
    }
  }

  // The warps' partial sums, added in ascending warp order: dk, then dv (one buffer).
  auto reduce = [&](const float(&mine)[kOutTiles][4], bf16* target, float factor) {
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 8 * dt + 2 * c + (e & 1);
        partial[(w * kSliceRows + row) * kDims + col] = mine[dt][e];
      }
    }
    __syncthreads();
    for (int idx = static_cast<int>(threadIdx.x); idx < kSliceRows * kDims;
         idx += static_cast<int>(blockDim.x)) {
      const int row = idx / kDims, col = idx % kDims;
      if (first + row >= s.seq || col >= s.head_dim) continue;
      float sum = 0.0f;
      for (int ww = 0; ww < warps; ++ww) sum += partial[(ww * kSliceRows + row) * kDims + col];
      const int64_t index = at(s, b, first + row, kvh, s.kv_heads, col);
      const float before = a.ring ? __bfloat162float(target[index]) : 0.0f;
      target[index] = __float2bfloat16_rn(before + sum * factor);
    }
    __syncthreads();
  };
  reduce(dk, a.dk, a.ring ? 1.0f : scale);  // a ring keeps dk / scale until its last step
  reduce(dv, a.dv, 1.0f);
}

}  // namespace

void launch_dkdv(const Args& a, cudaStream_t stream) {
  const LaunchConfig config = attention_dkdv_launch(a.shape);
  with_dim_tiles(a.shape.head_dim, [&](auto tiles) {
    detail::launch_with_large_shared(config, stream, tc_dkdv_kernel<decltype(tiles)::value>, a);
  });
}

std::vector<KernelEntry> dkdv_kernels() {
  return {{"tc_dkdv_kernel<2>", reinterpret_cast<const void*>(&tc_dkdv_kernel<2>)},
          {"tc_dkdv_kernel<4>", reinterpret_cast<const void*>(&tc_dkdv_kernel<4>)},
          {"tc_dkdv_kernel<8>", reinterpret_cast<const void*>(&tc_dkdv_kernel<8>)},
          {"tc_dkdv_kernel<16>", reinterpret_cast<const void*>(&tc_dkdv_kernel<16>)}};
}

}  // namespace tc
}  // namespace dhelix::cuda
