// Ring attention of context parallelism on the GPU (ring_attention_cuda.h): the row walks of
// runtime/cpu/ring_attention_cpu.cc, one thread per row, partner tiles staged in shared
// memory as in kernels_attention.cu.
//
// Forward step and dq: block (query tile of 64 local rows, head, sequence). For each half
// (local chunk) of the visiting block, key tiles of kAttentionTileKeys from the chunk's
// start; a thread folds the first min(64, visible - t) keys of tile t, visible being
// kernels::visible_keys of its global position: the CPU's tiles exactly. Once no thread of
// the block sees tile t, none sees a later one (visible is a prefix), so the block stops.
// dk/dv: block (key tile, kv head, sequence); for each query head of the group and each
// local chunk of this rank, query tiles from the chunk's start; a thread adds the queries
// from kernels::first_seeing_query on, ascending: the CPU's order split at tile borders.

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/kernels/context_parallel.h"

namespace dhelix::cuda {
namespace {

using kernels::AttentionShape;
constexpr int64_t kRows = kAttentionTileRows;
constexpr int64_t kKeys = kernels::kAttentionTileKeys;

// The ring step as plain values for a kernel argument.
struct Ring {
  int64_t cp = 1;
  int64_t rank = 0;
  int64_t block_rank = 0;
  int64_t chunk = 0;
};

Ring ring_of(const cpu::RingStep& step) {
  return {.cp = step.cp, .rank = step.rank, .block_rank = step.block_rank, .chunk = step.chunk};
}

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }
__device__ inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// Element d of head h at local token t of sequence b in a [batch, seq, heads, hd] tensor.
__device__ inline int64_t at(int64_t b, int64_t t, int64_t h, int64_t d, int64_t seq, int64_t heads,
                             int64_t hd) {
  return ((b * seq + t) * heads + h) * hd + d;
}

// Rows [first, first + count) of head h of two tensors into shared fp32 tiles [count, hd].
__device__ void stage_rows(const bf16* a, const bf16* b_tensor, int64_t b, int64_t first,
                           int64_t count, int64_t h, int64_t seq, int64_t heads, int64_t hd,
                           float* a_tile, float* b_tile) {
  for (int64_t idx = threadIdx.x; idx < count * hd; idx += blockDim.x) {
    const int64_t j = idx / hd;
    const int64_t d = idx % hd;
    a_tile[idx] = f32(a[at(b, first + j, h, d, seq, heads, hd)]);
    b_tile[idx] = f32(b_tensor[at(b, first + j, h, d, seq, heads, hd)]);
  }
}

// The local query row a thread of the forward and dq kernels owns.
struct QueryRow {
  int64_t b = 0;
  int64_t h = 0;
  int64_t kvh = 0;
  int64_t i = 0;         ///< local token
  int64_t position = 0;  ///< its global position
  bool active = false;
};

__device__ inline QueryRow query_row(const AttentionShape& shape, const Ring& ring) {
  QueryRow row;
  row.b = blockIdx.z;
  row.h = blockIdx.y;
  row.kvh = row.h / (shape.heads / shape.kv_heads);
  row.i = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x;
  row.active = row.i < shape.seq;
  row.position =
      row.active ? kernels::cp_global_position(ring.cp, ring.rank, ring.chunk, row.i) : 0;
  return row;
}

// For each key tile of the visiting block that some query of the block sees: stages it and
// calls fold(count) on the threads that see `count` >= 1 of its keys.
template <class Fold>
__device__ void for_each_visible_tile(const AttentionShape& shape, const Ring& ring,
                                      const QueryRow& row, const bf16* k, const bf16* v,
                                      float* k_tile, float* v_tile, Fold fold) {
  const int64_t c = ring.chunk;
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t start = kernels::cp_chunk_start(ring.cp, ring.block_rank, c, half);
    const int64_t visible = row.active ? kernels::visible_keys(row.position, start, c) : 0;
    for (int64_t t = 0; t < c; t += kKeys) {
      if (__syncthreads_or(visible > t) == 0) break;  // the same answer on every thread
      stage_rows(k, v, row.b, half * c + t, min_i64(kKeys, c - t), row.kvh, shape.seq,
                 shape.kv_heads, shape.head_dim, k_tile, v_tile);
      __syncthreads();
      const int64_t count = kernels::keys_in_tile(visible, t, kKeys);
      if (count > 0) fold(count);
      __syncthreads();
    }
  }
}

__global__ void ring_start_kernel(int64_t rows, int64_t acc_elements, float* stats, float* acc) {
  for (int64_t idx = detail::global_thread(); idx < acc_elements; idx += detail::grid_threads()) {
    acc[idx] = 0.0f;
    if (idx < rows) {
      stats[2 * idx] = -INFINITY;
      stats[2 * idx + 1] = 0.0f;
    }
  }
}

__global__ void ring_forward_step_kernel(AttentionShape shape, Ring ring, const bf16* q,
                                         const bf16* k, const bf16* v, float* stats,
                                         float* acc_all) {
  extern __shared__ float shared[];
  const int64_t hd = shape.head_dim;
  float* k_tile = shared;
  float* v_tile = shared + kKeys * hd;
  const QueryRow row = query_row(shape, ring);
  const int64_t stat = (row.b * shape.heads + row.h) * shape.seq + row.i;
  const float scale = kernels::attention_scale(hd);
  float q_row[kMaxHeadDim];
  float acc[kMaxHeadDim];
  float scores[kKeys];
  kernels::OnlineSoftmaxState state;
  if (row.active) {
    state.max_score = stats[2 * stat];
    state.sum_exp = stats[2 * stat + 1];
  }
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd);
    q_row[d] = row.active ? f32(q[index]) : 0.0f;
    acc[d] = row.active ? acc_all[index] : 0.0f;
  }
  for_each_visible_tile(shape, ring, row, k, v, k_tile, v_tile, [&](int64_t count) {
    kernels::attention_forward_tile(hd, q_row, scale, k_tile, v_tile, hd, count, scores, &state,
                                    acc);
  });
  if (!row.active) return;
  stats[2 * stat] = state.max_score;
  stats[2 * stat + 1] = state.sum_exp;
  for (int64_t d = 0; d < hd; ++d) {
    acc_all[at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd)] = acc[d];
  }
}

// One thread per local query row, rows in [batch, heads, seq] order (the stats' order).
__global__ void ring_finish_kernel(AttentionShape shape, const float* stats, const float* acc_all,
                                   bf16* out, float* lse) {
  const int64_t rows = shape.batch * shape.heads * shape.seq, hd = shape.head_dim;
  for (int64_t stat = detail::global_thread(); stat < rows; stat += detail::grid_threads()) {
    const int64_t i = stat % shape.seq;
    const int64_t h = (stat / shape.seq) % shape.heads;
    const int64_t b = stat / (shape.seq * shape.heads);
    kernels::OnlineSoftmaxState state;
    state.max_score = stats[2 * stat];
    state.sum_exp = stats[2 * stat + 1];
    float acc[kMaxHeadDim];
    for (int64_t d = 0; d < hd; ++d) acc[d] = acc_all[at(b, i, h, d, shape.seq, shape.heads, hd)];
    lse[stat] = kernels::attention_forward_finish(hd, state, acc);
    for (int64_t d = 0; d < hd; ++d) {
      out[at(b, i, h, d, shape.seq, shape.heads, hd)] = __float2bfloat16_rn(acc[d]);
    }
  }
}

__global__ void ring_delta_kernel(AttentionShape shape, const bf16* out, const bf16* dout,
                                  float* delta) {
  const int64_t rows = shape.batch * shape.heads * shape.seq, hd = shape.head_dim;
  for (int64_t stat = detail::global_thread(); stat < rows; stat += detail::grid_threads()) {
    const int64_t i = stat % shape.seq;
    const int64_t h = (stat / shape.seq) % shape.heads;
    const int64_t b = stat / (shape.seq * shape.heads);
    float out_row[kMaxHeadDim];
    float dout_row[kMaxHeadDim];
    for (int64_t d = 0; d < hd; ++d) {
      const int64_t index = at(b, i, h, d, shape.seq, shape.heads, hd);
      out_row[d] = f32(out[index]);
      dout_row[d] = f32(dout[index]);
    }
    delta[stat] = kernels::attention_backward_delta(hd, dout_row, out_row);
  }
}

__global__ void ring_dq_kernel(AttentionShape shape, Ring ring, const bf16* q, const bf16* dout,
                               const float* lse, const float* delta, const bf16* k, const bf16* v,
                               bf16* dq_unscaled) {
  extern __shared__ float shared[];
  const int64_t hd = shape.head_dim;
  float* k_tile = shared;
  float* v_tile = shared + kKeys * hd;
  const QueryRow row = query_row(shape, ring);
  const int64_t stat = (row.b * shape.heads + row.h) * shape.seq + row.i;
  const float scale = kernels::attention_scale(hd);
  float q_row[kMaxHeadDim];
  float dout_row[kMaxHeadDim];
  float acc[kMaxHeadDim];
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd);
    q_row[d] = row.active ? f32(q[index]) : 0.0f;
    dout_row[d] = row.active ? f32(dout[index]) : 0.0f;
    acc[d] = row.active ? f32(dq_unscaled[index]) : 0.0f;
  }
  const float row_lse = row.active ? lse[stat] : 0.0f;
  const float row_delta = row.active ? delta[stat] : 0.0f;
  for_each_visible_tile(shape, ring, row, k, v, k_tile, v_tile, [&](int64_t count) {
    kernels::attention_backward_dq_tile(hd, q_row, dout_row, row_lse, row_delta, scale, k_tile,
                                        v_tile, hd, count, acc);
  });
  if (!row.active) return;
  for (int64_t d = 0; d < hd; ++d) {
    dq_unscaled[at(row.b, row.i, row.h, d, shape.seq, shape.heads, hd)] =
        __float2bfloat16_rn(acc[d]);
  }
}

__global__ void ring_dkdv_kernel(AttentionShape shape, Ring ring, const bf16* q, const bf16* dout,
                                 const float* lse, const float* delta, const bf16* k, const bf16* v,
                                 bf16* dk_unscaled, bf16* dv) {
  extern __shared__ float shared[];
  const int64_t hd = shape.head_dim, seq = shape.seq, c = ring.chunk;
  float* q_tile = shared;
  float* dout_tile = shared + kKeys * hd;
  float* lse_tile = shared + 2 * kKeys * hd;
  float* delta_tile = lse_tile + kKeys;
  const int64_t b = blockIdx.z;
  const int64_t kvh = blockIdx.y;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x;
  const bool active = j < seq;
  const int64_t key_position =
      active ? kernels::cp_global_position(ring.cp, ring.block_rank, c, j) : 0;
  const float scale = kernels::attention_scale(hd);
  float k_row[kMaxHeadDim];
  float v_row[kMaxHeadDim];
  float dk_acc[kMaxHeadDim];
  float dv_acc[kMaxHeadDim];
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(b, j, kvh, d, seq, shape.kv_heads, hd);
    k_row[d] = active ? f32(k[index]) : 0.0f;
    v_row[d] = active ? f32(v[index]) : 0.0f;
    dk_acc[d] = active ? f32(dk_unscaled[index]) : 0.0f;
    dv_acc[d] = active ? f32(dv[index]) : 0.0f;
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    const float* lse_head = lse + (b * shape.heads + h) * seq;
    const float* delta_head = delta + (b * shape.heads + h) * seq;
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t start = kernels::cp_chunk_start(ring.cp, ring.rank, c, half);
      const int64_t first = active ? kernels::first_seeing_query(key_position, start, c) : c;
      for (int64_t t = 0; t < c; t += kKeys) {
        const int64_t staged = min_i64(kKeys, c - t);
        const int64_t offset = kernels::first_query_in_tile(first, t, staged);
        const bool needs = offset < staged;
        if (__syncthreads_or(needs) == 0) continue;  // uniform over the block
        const int64_t local = half * c + t;
        stage_rows(q, dout, b, local, staged, h, seq, shape.heads, hd, q_tile, dout_tile);
        for (int64_t idx = threadIdx.x; idx < staged; idx += blockDim.x) {
          lse_tile[idx] = lse_head[local + idx];
          delta_tile[idx] = delta_head[local + idx];
        }
        __syncthreads();
        if (needs) {
          kernels::attention_backward_dkdv_tile(
              hd, k_row, v_row, scale, q_tile + offset * hd, dout_tile + offset * hd, hd,
              lse_tile + offset, delta_tile + offset, staged - offset, dk_acc, dv_acc);
        }
        __syncthreads();
      }
    }
  }
  if (!active) return;
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t index = at(b, j, kvh, d, seq, shape.kv_heads, hd);
    dk_unscaled[index] = __float2bfloat16_rn(dk_acc[d]);
    dv[index] = __float2bfloat16_rn(dv_acc[d]);
  }
}

__global__ void scale_kernel(int64_t count, float factor, bf16* values) {
  for (int64_t idx = detail::global_thread(); idx < count; idx += detail::grid_threads()) {
    values[idx] = __float2bfloat16_rn(f32(values[idx]) * factor);
  }
}

void check_ring(const AttentionShape& shape, const cpu::RingStep& step) {
  DHELIX_CHECK(shape.kv_heads >= 1 && shape.heads % shape.kv_heads == 0);
  DHELIX_CHECK(step.chunk > 0 && shape.seq == 2 * step.chunk);
  DHELIX_CHECK(step.cp >= 1 && step.rank >= 0 && step.rank < step.cp && step.block_rank >= 0 &&
               step.block_rank < step.cp);
}

int64_t rows_of(const AttentionShape& shape) { return shape.batch * shape.heads * shape.seq; }

}  // namespace

int64_t ring_state_stats_elements(const AttentionShape& shape) { return 2 * rows_of(shape); }

int64_t ring_state_acc_elements(const AttentionShape& shape) {
  return rows_of(shape) * shape.head_dim;
}

std::vector<KernelEntry> ring_attention_kernels() {
  return {{"ring_start_kernel", reinterpret_cast<const void*>(&ring_start_kernel)},
          {"ring_forward_step_kernel", reinterpret_cast<const void*>(&ring_forward_step_kernel)},
          {"ring_finish_kernel", reinterpret_cast<const void*>(&ring_finish_kernel)},
          {"ring_delta_kernel", reinterpret_cast<const void*>(&ring_delta_kernel)},
          {"ring_dq_kernel", reinterpret_cast<const void*>(&ring_dq_kernel)},
          {"ring_dkdv_kernel", reinterpret_cast<const void*>(&ring_dkdv_kernel)},
          {"scale_kernel", reinterpret_cast<const void*>(&scale_kernel)}};
}

void ring_forward_start(const AttentionShape& shape, RingDeviceState state, cudaStream_t stream) {
  const int64_t acc = ring_state_acc_elements(shape);
  // acc has head_dim >= 1 elements per row, so the loop over it covers every row's stats.
  detail::launch_with_large_shared(thread_per_item_launch(acc), stream, ring_start_kernel,
                                   rows_of(shape), acc, state.stats, state.acc);
}

void ring_forward_step(const AttentionShape& shape, const cpu::RingStep& step, const bf16* q,
                       const bf16* k, const bf16* v, RingDeviceState state, cudaStream_t stream) {
  check_ring(shape, step);
  detail::launch_with_large_shared(attention_launch(shape), stream, ring_forward_step_kernel, shape,
                                   ring_of(step), q, k, v, state.stats, state.acc);
}

void ring_forward_finish(const AttentionShape& shape, RingDeviceState state, bf16* out, float* lse,
                         cudaStream_t stream) {
  detail::launch_with_large_shared(
      thread_per_item_launch(rows_of(shape)), stream, ring_finish_kernel, shape,
      static_cast<const float*>(state.stats), static_cast<const float*>(state.acc), out, lse);
}

void ring_backward_delta(const AttentionShape& shape, const bf16* out, const bf16* dout,
                         float* delta, cudaStream_t stream) {
  detail::launch_with_large_shared(thread_per_item_launch(rows_of(shape)), stream,
                                   ring_delta_kernel, shape, out, dout, delta);
}

void ring_backward_step(const AttentionShape& shape, const cpu::RingStep& step, const bf16* q,
                        const bf16* dout, const float* lse, const float* delta, const bf16* k,
                        const bf16* v, bf16* dq_unscaled, bf16* dk_unscaled, bf16* dv,
                        cudaStream_t stream) {
  check_ring(shape, step);
  const Ring ring = ring_of(step);
  detail::launch_with_large_shared(attention_launch(shape), stream, ring_dq_kernel, shape, ring, q,
                                   dout, lse, delta, k, v, dq_unscaled);
  detail::launch_with_large_shared(attention_dkdv_launch(shape), stream, ring_dkdv_kernel, shape,
                                   ring, q, dout, lse, delta, k, v, dk_unscaled, dv);
}

void scale_tensor(int64_t count, float factor, bf16* values, cudaStream_t stream) {
  detail::launch_with_large_shared(thread_per_item_launch(count), stream, scale_kernel, count,
                                   factor, values);
}

}  // namespace dhelix::cuda
