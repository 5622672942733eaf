// The forward and dq passes of the tensor-core attention (attention_tc.h), the per-row
// delta, and the host entry points. The dk/dv pass is kernels_attention_tc_dkdv.cu.
//
// A block of 4 warps owns 64 query rows of one head; warp w the 16 rows from
// 64 blockIdx.x + 16 w. For each run of the key layout the block stages key tiles of 64
// from the run's first key, stops at the first tile whose first key comes after the
// block's latest query, and a warp skips a tile whose first key comes after its own
// latest query: the host twin's tiles (runtime/cpu/attention_tc_twin.cc) exactly.
// Lane (g, c) holds rows r0 = first + g and r1 = r0 + 8 and, per 8-column tile, columns
// 2c and 2c + 1 (mma_bf16.cuh).

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/attention_tc_common.cuh"
#include "runtime/cuda/launch_util.cuh"

namespace dhelix::cuda {
namespace tc {
namespace {

// The rows of one warp: positions (-1 past the sequence) and the warp's latest position.
struct Slice {
  int64_t first = 0;
  int64_t r0 = 0;
  int64_t pos[2] = {-1, -1};
  int64_t latest = -1;
};

__device__ Slice slice_of(const Args& a) {
  Slice s;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  s.first = static_cast<int64_t>(blockIdx.x) * kBlockWarps * kSliceRows + warp * kSliceRows;
  s.r0 = s.first + mma::lane_group();
  const int64_t seq = a.shape.seq;
  for (int r = 0; r < 2; ++r) {
    const int64_t row = s.r0 + 8 * r;
    s.pos[r] = row < seq ? layout_position(a.layouts.queries, row) : -1;
  }
  const int64_t end = s.first + kSliceRows < seq ? s.first + kSliceRows : seq;
  s.latest = latest_position(a.layouts.queries, s.first, end);
  return s;
}

// The block's latest query position: the stop test of the tile loop, uniform over the block.
__device__ int64_t block_latest(const Args& a) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlockWarps * kSliceRows;
  const int64_t end = first + kBlockWarps * kSliceRows;
  return latest_position(a.layouts.queries, first, end < a.shape.seq ? end : a.shape.seq);
}

// Walks the key tiles the block needs, staging K and V; calls work(t, count) on the warps
// whose rows see some key of the tile.
template <class Work>
__device__ void for_each_key_tile(const Args& a, const Slice& slice, int dims, int stride,
                                  bf16* k_tile, bf16* v_tile, Work work) {
  const int64_t b = blockIdx.z;
  const int64_t kvh = blockIdx.y / (a.shape.heads / a.shape.kv_heads);
  const int64_t latest = block_latest(a);
  const TokenLayout& keys = a.layouts.keys;
  for (int run = 0; run < 2; ++run) {
    const int64_t begin = run == 0 ? 0 : keys.part, end = run == 0 ? keys.part : a.shape.seq;
    for (int64_t t = begin; t < end; t += kTileKeys) {
      const int64_t first_key = layout_position(keys, t);
      if (first_key > latest) break;
      const int64_t count = end - t < kTileKeys ? end - t : kTileKeys;
      __syncthreads();  // the previous tile is consumed
      stage_tile(a.shape, a.k, b, t, count, kvh, a.shape.kv_heads, dims, stride, k_tile);
      stage_tile(a.shape, a.v, b, t, count, kvh, a.shape.kv_heads, dims, stride, v_tile);
      __syncthreads();
      if (first_key <= slice.latest) work(t, count);
    }
  }
}

// Scores of the warp's 16 rows against 8 x 8 keys of the staged tile: acc = X T^T.
template <int kDT>
__device__ void tile_product(const uint32_t (&x)[kDT][4], const bf16* tile, int stride,
                             float (&acc)[8][4]) {
  for (int nt = 0; nt < 8; ++nt) {
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < kDT; ++kt) {
      uint32_t b0, b1;
      tile_b_rows(tile, stride, nt, kt, b0, b1);
      mma::mma_bf16(acc[nt], x[kt], b0, b1);
    }
  }
}

// Whether row r (0: g, 1: g + 8) of the slice sees key 8 nt + 2c + (e & 1) of tile t.
__device__ inline bool sees(const Args& a, const Slice& slice, int64_t t, int64_t count, int nt,
                            int e) {
  const int64_t key = 8 * nt + 2 * mma::lane_pair() + (e & 1);
  const int64_t row_pos = slice.pos[e / 2];
  return key < count && row_pos >= 0 && layout_position(a.layouts.keys, t + key) <= row_pos;
}

template <int kDT>
__global__ void __launch_bounds__(128) tc_forward_kernel(Args a) {
  constexpr int kDims = 16 * kDT, kStride = kDims + 8, kOutTiles = 2 * kDT;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);
  bf16* v_tile = k_tile + kTileKeys * kStride;
  const AttentionShape& s = a.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int c = mma::lane_pair();
  const Slice slice = slice_of(a);
  const float scale = kernels::attention_scale(s.head_dim);

  uint32_t qa[kDT][4];
#pragma unroll
  for (int kt = 0; kt < kDT; ++kt) load_a(s, a.q, b, slice.r0, h, s.heads, kt, qa[kt]);
  float o[kOutTiles][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < kOutTiles; ++dt) {
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  }
  if (a.ring) {  // resume the state of the earlier steps; lane c = 0 carries the sum
    for (int r = 0; r < 2; ++r) {
      const int64_t row = slice.r0 + 8 * r;
      if (row >= s.seq) continue;
      const int64_t st = stat(s, b, h, row);
      m[r] = a.stats[2 * st];
      l[r] = c == 0 ? a.stats[2 * st + 1] : 0.0f;
#pragma unroll
      for (int dt = 0; dt < kOutTiles; ++dt) {
        const int64_t d = 8 * dt + 2 * c;
        if (d >= s.head_dim) continue;
        const float2 saved = *reinterpret_cast<const float2*>(a.acc + at(s, b, row, h, s.heads, d));
        o[dt][2 * r] = saved.x;
        o[dt][2 * r + 1] = saved.y;
      }
    }
  }

  for_each_key_tile(a, slice, kDims, kStride, k_tile, v_tile, [&](int64_t t, int64_t count) {
    float sc[8][4];
    tile_product<kDT>(qa, k_tile, kStride, sc);
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = sees(a, slice, t, count, nt, e) ? sc[nt][e] * scale : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], sc[nt][e]);
      }
    }
    float use_max[2], correction[2], tile_sum[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      const float new_max = fmaxf(m[r], mma::quad_max(tile_max[r]));
      // A row that has seen no key keeps max -inf: exp against 0 gives 0, not NaN.
      use_max[r] = new_max == -INFINITY ? 0.0f : new_max;
      correction[r] = expf(m[r] - use_max[r]);
      m[r] = new_max;
    }
    for (int nt = 0; nt < 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = expf(sc[nt][e] - use_max[e / 2]);
        tile_sum[e / 2] += sc[nt][e];
      }
    }
    for (int r = 0; r < 2; ++r) l[r] = l[r] * correction[r] + tile_sum[r];
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      for (int e = 0; e < 4; ++e) o[dt][e] *= correction[e / 2];
    }
    for (int j = 0; j < kTileKeys / 16; ++j) {
      uint32_t pa[4];
      mma::pack_a_from_c(sc[2 * j], sc[2 * j + 1], pa);
#pragma unroll
      for (int dt = 0; dt < kOutTiles; ++dt) {
        uint32_t b0, b1;
        tile_b_cols(v_tile, kStride, j, dt, b0, b1);
        mma::mma_bf16(o[dt], pa, b0, b1);
      }
    }
  });

  for (int r = 0; r < 2; ++r) {
    const float sum = mma::quad_sum(l[r]);  // every lane of the quad, before any exit
    const int64_t row = slice.r0 + 8 * r;
    if (row >= s.seq) continue;
    const int64_t st = stat(s, b, h, row);
    if (a.ring && c == 0) {
      a.stats[2 * st] = m[r];
      a.stats[2 * st + 1] = sum;
    } else if (!a.ring && c == 0) {
      a.lse_out[st] = m[r] + logf(sum);
    }
    const float inverse = 1.0f / sum;
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      const int64_t d = 8 * dt + 2 * c;
      if (d >= s.head_dim) continue;
      const int64_t index = at(s, b, row, h, s.heads, d);
      if (a.ring) {
        *reinterpret_cast<float2*>(a.acc + index) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
      } else {
        *reinterpret_cast<uint32_t*>(a.out + index) =
            mma::pack_rounded(o[dt][2 * r] * inverse, o[dt][2 * r + 1] * inverse);
      }
    }
  }
}

template <int kDT>
__global__ void __launch_bounds__(128) tc_dq_kernel(Args a) {
  constexpr int kDims = 16 * kDT, kStride = kDims + 8, kOutTiles = 2 * kDT;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);
  bf16* v_tile = k_tile + kTileKeys * kStride;
  const AttentionShape& s = a.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int c = mma::lane_pair();
  const Slice slice = slice_of(a);
  const float scale = kernels::attention_scale(s.head_dim);

  uint32_t qa[kDT][4], da[kDT][4];
#pragma unroll
  for (int kt = 0; kt < kDT; ++kt) {
    load_a(s, a.q, b, slice.r0, h, s.heads, kt, qa[kt]);
    load_a(s, a.dout, b, slice.r0, h, s.heads, kt, da[kt]);
  }
  float row_lse[2] = {0.0f, 0.0f}, row_delta[2] = {0.0f, 0.0f};
  float dq[kOutTiles][4];
  for (int r = 0; r < 2; ++r) {
    const int64_t row = slice.r0 + 8 * r;
    if (row < s.seq) {
      row_lse[r] = a.lse[stat(s, b, h, row)];
      row_delta[r] = a.delta[stat(s, b, h, row)];
    }
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      const int64_t d = 8 * dt + 2 * c;
      const bool held = a.ring && row < s.seq && d < s.head_dim;
      const int64_t index = held ? at(s, b, row, h, s.heads, d) : 0;
      dq[dt][2 * r] = held ? __bfloat162float(a.dq[index]) : 0.0f;
      dq[dt][2 * r + 1] = held ? __bfloat162float(a.dq[index + 1]) : 0.0f;
    }
  }

  for_each_key_tile(a, slice, kDims, kStride, k_tile, v_tile, [&](int64_t t, int64_t count) {
    float p[8][4], dp[8][4];
    tile_product<kDT>(qa, k_tile, kStride, p);
    tile_product<kDT>(da, v_tile, kStride, dp);
    for (int nt = 0; nt < 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const float prob =
            sees(a, slice, t, count, nt, e) ? expf(p[nt][e] * scale - row_lse[e / 2]) : 0.0f;
        p[nt][e] = prob * (dp[nt][e] - row_delta[e / 2]);  // now dS
      }
    }
    for (int j = 0; j < kTileKeys / 16; ++j) {
      uint32_t dsa[4];
      mma::pack_a_from_c(p[2 * j], p[2 * j + 1], dsa);
#pragma unroll
      for (int dt = 0; dt < kOutTiles; ++dt) {
        uint32_t b0, b1;
        tile_b_cols(k_tile, kStride, j, dt, b0, b1);
        mma::mma_bf16(dq[dt], dsa, b0, b1);
      }
    }
  });

  const float factor = a.ring ? 1.0f : scale;  // a ring keeps dq / scale until its last step
  for (int r = 0; r < 2; ++r) {
    const int64_t row = slice.r0 + 8 * r;
    if (row >= s.seq) continue;
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      const int64_t d = 8 * dt + 2 * c;
      if (d >= s.head_dim) continue;
      *reinterpret_cast<uint32_t*>(a.dq + at(s, b, row, h, s.heads, d)) =
          mma::pack_rounded(dq[dt][2 * r] * factor, dq[dt][2 * r + 1] * factor);
    }
  }
}

// delta[stat] = dout . out for rows in [batch, heads, seq] order, one warp per row: lane l
// adds dimensions l, l + 32, ... in order, then the lane tree (launch_util.cuh).
__global__ void tc_delta_kernel(AttentionShape s, const bf16* out, const bf16* dout, float* delta) {
  const int64_t rows = s.batch * s.heads * s.seq;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = detail::global_thread() / 32; row < rows; row += warps) {
    const int64_t i = row % s.seq, h = (row / s.seq) % s.heads, b = row / (s.seq * s.heads);
    float partial = 0.0f;
    for (int64_t d = lane; d < s.head_dim; d += 32) {
      const int64_t index = at(s, b, i, h, s.heads, d);
      partial += __bfloat162float(dout[index]) * __bfloat162float(out[index]);
    }
    const float total = detail::warp_lane_tree_sum(partial);
    if (lane == 0) delta[row] = total;
  }
}

}  // namespace

void check_args(const Args& a) {
  const AttentionShape& s = a.shape;
  DHELIX_CHECK(s.kv_heads >= 1 && s.heads % s.kv_heads == 0);
  for (const TokenLayout& layout : {a.layouts.queries, a.layouts.keys}) {
    DHELIX_CHECK(layout.part >= 0 && layout.part <= s.seq);
  }
}

// The instances, by padded head dimension (launch_config.h, tc_dim_tiles).
void launch_forward(const Args& a, cudaStream_t stream) {
  const LaunchConfig config = attention_launch(a.shape);
  with_dim_tiles(a.shape.head_dim, [&](auto tiles) {
    detail::launch_with_large_shared(config, stream, tc_forward_kernel<decltype(tiles)::value>, a);
  });
}

void launch_dq(const Args& a, cudaStream_t stream) {
  const LaunchConfig config = attention_launch(a.shape);
  with_dim_tiles(a.shape.head_dim, [&](auto tiles) {
    detail::launch_with_large_shared(config, stream, tc_dq_kernel<decltype(tiles)::value>, a);
  });
}

std::vector<KernelEntry> forward_dq_kernels() {
  return {{"tc_forward_kernel<2>", reinterpret_cast<const void*>(&tc_forward_kernel<2>)},
          {"tc_forward_kernel<4>", reinterpret_cast<const void*>(&tc_forward_kernel<4>)},
          {"tc_forward_kernel<8>", reinterpret_cast<const void*>(&tc_forward_kernel<8>)},
          {"tc_forward_kernel<16>", reinterpret_cast<const void*>(&tc_forward_kernel<16>)},
          {"tc_dq_kernel<2>", reinterpret_cast<const void*>(&tc_dq_kernel<2>)},
          {"tc_dq_kernel<4>", reinterpret_cast<const void*>(&tc_dq_kernel<4>)},
          {"tc_dq_kernel<8>", reinterpret_cast<const void*>(&tc_dq_kernel<8>)},
          {"tc_dq_kernel<16>", reinterpret_cast<const void*>(&tc_dq_kernel<16>)},
          {"tc_delta_kernel", reinterpret_cast<const void*>(&tc_delta_kernel)}};
}

}  // namespace tc

std::vector<KernelEntry> attention_tc_kernels() {
  std::vector<KernelEntry> all = tc::forward_dq_kernels();
  for (const KernelEntry& entry : tc::dkdv_kernels()) all.push_back(entry);
  return all;
}

void tc_attention_forward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                          const bf16* v, bf16* out, float* lse, cudaStream_t stream) {
  tc::Args a;
  a.shape = shape;
  a.layouts = {kernels::causal_layout(shape.seq), kernels::causal_layout(shape.seq)};
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse_out = lse;
  tc::check_args(a);
  tc::launch_forward(a, stream);
}

void tc_attention_forward_step(const kernels::AttentionShape& shape,
                               const kernels::AttentionLayouts& layouts, const bf16* q,
                               const bf16* k, const bf16* v, float* stats, float* acc,
                               cudaStream_t stream) {
  tc::Args a;
  a.shape = shape;
  a.layouts = layouts;
  a.q = q;
  a.k = k;
  a.v = v;
  a.stats = stats;
  a.acc = acc;
  a.ring = true;
  tc::check_args(a);
  tc::launch_forward(a, stream);
}

void tc_attention_delta(const kernels::AttentionShape& shape, const bf16* out, const bf16* dout,
                        float* delta, cudaStream_t stream) {
  detail::launch(warp_per_row_launch(shape.batch * shape.heads * shape.seq), stream,
                 tc::tc_delta_kernel, shape, out, dout, delta);
}

void tc_attention_backward(const kernels::AttentionShape& shape,
                           const kernels::AttentionLayouts& layouts, const TcBackward& args,
                           cudaStream_t stream) {
  tc::Args a;
  a.shape = shape;
  a.layouts = layouts;
  a.q = args.q;
  a.dout = args.dout;
  a.lse = args.lse;
  a.delta = args.delta;
  a.k = args.k;
  a.v = args.v;
  a.dq = args.dq;
  a.dk = args.dk;
  a.dv = args.dv;
  a.ring = args.accumulate;
  tc::check_args(a);
  // One stream, two passes that own their outputs: no ordering between them is needed.
  tc::launch_dq(a, stream);
  tc::launch_dkdv(a, stream);
}

}  // namespace dhelix::cuda
