// Causal GQA flash attention on the GPU (kernels_cuda.h): the tile functions of
// runtime/kernels/attention.h run by one thread per query (or key) row on a partner tile
// staged in shared memory as fp32. Correctness over speed: each thread keeps its row and
// accumulators in registers/local memory (head_dim <= kMaxHeadDim), no tensor cores.
//
// Forward: block (query tile, head, sequence); key tiles of kAttentionTileKeys from 0 up to
// the block's last query, each staged once for the block's 64 threads; a thread folds the
// first min(64, i + 1 - start) keys of a tile, exactly the tiles of the CPU's
// attention_forward_row, so both use the same online-softmax steps.
// Backward: the dq pass (same grid) computes delta_i = dout_i . out_i, stores it, and sums
// its keys in ascending order; the dk/dv pass (block per key tile, kv head, sequence) then
// walks the group's query heads ascending and, within one, the queries i >= j ascending.

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/launch_util.cuh"

namespace dhelix::cuda {
namespace {

using kernels::AttentionShape;
constexpr int64_t kTile = kAttentionTileRows;

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }
__device__ inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

// Index of element d of head h at token t of sequence b in a [batch, seq, heads, hd] tensor.
__device__ inline int64_t at(int64_t b, int64_t t, int64_t h, int64_t d, int64_t seq, int64_t heads,
                             int64_t hd) {
  return ((b * seq + t) * heads + h) * hd + d;
}

// Stages rows [start, start + count) of head h (of `heads`) of two tensors into shared
// fp32 tiles [kTile, hd].
__device__ void stage_pair(const bf16* a, const bf16* b_tensor, int64_t b, int64_t start,
                           int64_t count, int64_t h, int64_t seq, int64_t heads, int64_t hd,
                           float* a_tile, float* b_tile) {
  for (int64_t idx = threadIdx.x; idx < count * hd; idx += blockDim.x) {
    const int64_t j = idx / hd;
    const int64_t d = idx % hd;
    a_tile[idx] = f32(a[at(b, start + j, h, d, seq, heads, hd)]);
    b_tile[idx] = f32(b_tensor[at(b, start + j, h, d, seq, heads, hd)]);
  }
}

// The query row a thread of the forward and dq kernels owns: block (query tile, head,
// sequence), thread = row within the tile; rows past the sequence are inactive but still
// help stage tiles.
struct QueryRow {
  int64_t b = 0;    ///< sequence
  int64_t h = 0;    ///< query head
  int64_t kvh = 0;  ///< its KV head (GQA)
  int64_t i = 0;    ///< query position
  bool active = false;
};

__device__ inline QueryRow query_row(const AttentionShape& shape) {
  QueryRow row;
  row.b = blockIdx.z;
  row.h = blockIdx.y;
  row.kvh = row.h / (shape.heads / shape.kv_heads);
  row.i = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  row.active = row.i < shape.seq;
  return row;
}

// Stages every key tile the block's queries attend to (from 0 to the block's last query)
// into k_tile and v_tile, and for each calls fold(count) on the threads whose query sees
// the tile: count = its keys at or before the query, the CPU's tile split.
template <class Fold>
__device__ void for_each_key_tile(const AttentionShape& shape, const QueryRow& row, const bf16* k,
                                  const bf16* v, float* k_tile, float* v_tile, Fold fold) {
  const int64_t block_end = min_i64(shape.seq, (static_cast<int64_t>(blockIdx.x) + 1) * kTile);
  for (int64_t start = 0; start < block_end; start += kTile) {
    const int64_t staged = min_i64(kTile, shape.seq - start);
    stage_pair(k, v, row.b, start, staged, row.kvh, shape.seq, shape.kv_heads, shape.head_dim,
               k_tile, v_tile);
    __syncthreads();
    if (row.active && start <= row.i) fold(min_i64(kTile, row.i + 1 - start));
    __syncthreads();
  }
}

__global__ void attention_forward_kernel(AttentionShape shape, const bf16* q, const bf16* k,
                                         const bf16* v, bf16* out, float* lse) {
  extern __shared__ float shared[];
  float* k_tile = shared;
  float* v_tile = shared + kTile * shape.head_dim;
  const int64_t hd = shape.head_dim;
  const QueryRow row = query_row(shape);
  const float scale = kernels::attention_scale(hd);
  float q_row[kMaxHeadDim];
  float acc[kMaxHeadDim];
  float scores[kTile];
  kernels::OnlineSoftmaxState state;
  for (int64_t d = 0; d < hd; ++d) {
    q_row[d] = row.active ? f32(q[at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd)]) : 0.0f;
    acc[d] = 0.0f;
  }
  for_each_key_tile(shape, row, k, v, k_tile, v_tile, [&](int64_t count) {
    kernels::attention_forward_tile(hd, q_row, scale, k_tile, v_tile, hd, count, scores, &state,
                                    acc);
  });
  if (!row.active) return;
  const float row_lse = kernels::attention_forward_finish(hd, state, acc);
  for (int64_t d = 0; d < hd; ++d) {
    out[at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd)] = __float2bfloat16_rn(acc[d]);
  }
  lse[(row.b * shape.heads + row.h) * shape.seq + row.i] = row_lse;
}

__global__ void attention_dq_kernel(AttentionShape shape, const bf16* q, const bf16* k,
                                    const bf16* v, const bf16* out, const float* lse,
                                    const bf16* dout, bf16* dq, float* delta) {
  extern __shared__ float shared[];
  float* k_tile = shared;
  float* v_tile = shared + kTile * shape.head_dim;
  const int64_t hd = shape.head_dim;
  const QueryRow row = query_row(shape);
  const float scale = kernels::attention_scale(hd);
  const int64_t stat = (row.b * shape.heads + row.h) * shape.seq + row.i;
  float q_row[kMaxHeadDim];
  float dout_row[kMaxHeadDim];
  float acc[kMaxHeadDim];  // first the output row (for delta), then dq / scale
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd);
    q_row[d] = row.active ? f32(q[index]) : 0.0f;
    dout_row[d] = row.active ? f32(dout[index]) : 0.0f;
    acc[d] = row.active ? f32(out[index]) : 0.0f;
  }
  const float row_delta = kernels::attention_backward_delta(hd, dout_row, acc);
  const float row_lse = row.active ? lse[stat] : 0.0f;
  if (row.active) delta[stat] = row_delta;
  for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
  for_each_key_tile(shape, row, k, v, k_tile, v_tile, [&](int64_t count) {
    kernels::attention_backward_dq_tile(hd, q_row, dout_row, row_lse, row_delta, scale, k_tile,
                                        v_tile, hd, count, acc);
  });
  if (!row.active) return;
  for (int64_t d = 0; d < hd; ++d) {
    dq[at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd)] =
        __float2bfloat16_rn(acc[d] * scale);
  }
}

__global__ void attention_dkdv_kernel(AttentionShape shape, const bf16* q, const bf16* k,
                                      const bf16* v, const float* lse, const bf16* dout,
                                      const float* delta, bf16* dk, bf16* dv) {
  extern __shared__ float shared[];
  const int64_t hd = shape.head_dim;
  float* q_tile = shared;
  float* dout_tile = shared + kTile * hd;
  float* lse_tile = shared + 2 * kTile * hd;
  float* delta_tile = lse_tile + kTile;
  const int64_t b = blockIdx.z;
  const int64_t kvh = blockIdx.y;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t first_key = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t j = first_key + threadIdx.x;
  const bool active = j < shape.seq;
  const float scale = kernels::attention_scale(hd);
  float k_row[kMaxHeadDim];
  float v_row[kMaxHeadDim];
  float dk_acc[kMaxHeadDim];
  float dv_acc[kMaxHeadDim];
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(b, j, kvh, d, shape.seq, shape.kv_heads, hd);
    k_row[d] = active ? f32(k[index]) : 0.0f;
    v_row[d] = active ? f32(v[index]) : 0.0f;
    dk_acc[d] = 0.0f;
    dv_acc[d] = 0.0f;
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    const float* lse_head = lse + (b * shape.heads + h) * shape.seq;
    const float* delta_head = delta + (b * shape.heads + h) * shape.seq;
    for (int64_t start = first_key; start < shape.seq; start += kTile) {
      const int64_t staged = min_i64(kTile, shape.seq - start);
      stage_pair(q, dout, b, start, staged, h, shape.seq, shape.heads, hd, q_tile, dout_tile);
      for (int64_t idx = threadIdx.x; idx < staged; idx += blockDim.x) {
        lse_tile[idx] = lse_head[start + idx];
        delta_tile[idx] = delta_head[start + idx];
      }
      __syncthreads();
      const int64_t first = max_i64(j, start);
      if (active && first < start + staged) {
        const int64_t offset = first - start;
        kernels::attention_backward_dkdv_tile(hd, k_row, v_row, scale, q_tile + offset * hd,
                                              dout_tile + offset * hd, hd, lse_tile + offset,
                                              delta_tile + offset, staged - offset, dk_acc, dv_acc);
      }
      __syncthreads();
    }
  }
  if (!active) return;
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(b, j, kvh, d, shape.seq, shape.kv_heads, hd);
    dk[index] = __float2bfloat16_rn(dk_acc[d] * scale);
    dv[index] = __float2bfloat16_rn(dv_acc[d]);
  }
}

void check_groups(const AttentionShape& shape) {
  DHELIX_CHECK(shape.kv_heads >= 1 && shape.heads % shape.kv_heads == 0);
}

}  // namespace

std::vector<KernelEntry> attention_kernels() {
  return {{"attention_forward_kernel", reinterpret_cast<const void*>(&attention_forward_kernel)},
          {"attention_dq_kernel", reinterpret_cast<const void*>(&attention_dq_kernel)},
          {"attention_dkdv_kernel", reinterpret_cast<const void*>(&attention_dkdv_kernel)}};
}

void attention_forward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                       bf16* out, float* lse, cudaStream_t stream) {
  check_groups(shape);
  detail::launch_with_large_shared(attention_launch(shape), stream, attention_forward_kernel, shape,
                                   q, k, v, out, lse);
}

void attention_backward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                        bf16* dv, float* delta, cudaStream_t stream) {
  check_groups(shape);
  // Same stream: the dk/dv pass reads the delta the dq pass wrote.
  detail::launch_with_large_shared(attention_launch(shape), stream, attention_dq_kernel, shape, q,
                                   k, v, out, lse, dout, dq, delta);
  detail::launch_with_large_shared(attention_dkdv_launch(shape), stream, attention_dkdv_kernel,
                                   shape, q, k, v, lse, dout, delta, dk, dv);
}

}  // namespace dhelix::cuda
