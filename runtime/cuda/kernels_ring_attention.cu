// Ring attention of context parallelism on the GPU (ring_attention_cuda.h). Each step is
// the tensor-core flash kernels of attention_tc.h with the ring's layouts: the local
// queries at rank r's positions, the visiting K/V block at block_rank's
// (kernels::cp_layout), so the causal band of every ring offset is the mask
// position(key) <= position(query), exactly kernels::visible_keys / first_seeing_query.
// This file keeps the state's start and finish, and the closing scale.
//
// Finish: one warp per local query row (lanes over the head dimension): out = acc / sum,
// lse = max + log(sum), the same expressions as kernels::attention_forward_finish.

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/kernels/attention_layout.h"

namespace dhelix::cuda {
namespace {

using kernels::AttentionShape;

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }

// Element d of head h at local token t of sequence b in a [batch, seq, heads, hd] tensor.
__device__ inline int64_t at(int64_t b, int64_t t, int64_t h, int64_t d, int64_t seq, int64_t heads,
                             int64_t hd) {
  return ((b * seq + t) * heads + h) * hd + d;
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

// One warp per local query row, rows in [batch, heads, seq] order (the stats' order).
__global__ void ring_finish_kernel(AttentionShape shape, const float* stats, const float* acc_all,
                                   bf16* out, float* lse) {
  const int64_t rows = shape.batch * shape.heads * shape.seq, hd = shape.head_dim;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t stat = detail::global_thread() / 32; stat < rows; stat += warps) {
    const int64_t i = stat % shape.seq;
    const int64_t h = (stat / shape.seq) % shape.heads;
    const int64_t b = stat / (shape.seq * shape.heads);
    const float sum = stats[2 * stat + 1];
    const float inverse_sum = 1.0f / sum;
    if (lane == 0) lse[stat] = stats[2 * stat] + logf(sum);
    for (int64_t d = lane; d < hd; d += 32) {
      const int64_t index = at(b, i, h, d, shape.seq, shape.heads, hd);
      out[index] = __float2bfloat16_rn(acc_all[index] * inverse_sum);
    }
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

// The local queries sit at this rank's positions, the visiting keys at the block owner's.
kernels::AttentionLayouts layouts_of(const cpu::RingStep& step) {
  return {kernels::cp_layout(step.cp, step.rank, step.chunk),
          kernels::cp_layout(step.cp, step.block_rank, step.chunk)};
}

}  // namespace

int64_t ring_state_stats_elements(const AttentionShape& shape) { return 2 * rows_of(shape); }

int64_t ring_state_acc_elements(const AttentionShape& shape) {
  return rows_of(shape) * shape.head_dim;
}

std::vector<KernelEntry> ring_attention_kernels() {
  return {{"ring_start_kernel", reinterpret_cast<const void*>(&ring_start_kernel)},
          {"ring_finish_kernel", reinterpret_cast<const void*>(&ring_finish_kernel)},
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
  tc_attention_forward_step(shape, layouts_of(step), q, k, v, state.stats, state.acc, stream);
}

void ring_forward_finish(const AttentionShape& shape, RingDeviceState state, bf16* out, float* lse,
                         cudaStream_t stream) {
  detail::launch(warp_per_row_launch(rows_of(shape)), stream, ring_finish_kernel, shape,
                 static_cast<const float*>(state.stats), static_cast<const float*>(state.acc), out,
                 lse);
}

void ring_backward_delta(const AttentionShape& shape, const bf16* out, const bf16* dout,
                         float* delta, cudaStream_t stream) {
  tc_attention_delta(shape, out, dout, delta, stream);
}

void ring_backward_step(const AttentionShape& shape, const cpu::RingStep& step, const bf16* q,
                        const bf16* dout, const float* lse, const float* delta, const bf16* k,
                        const bf16* v, bf16* dq_unscaled, bf16* dk_unscaled, bf16* dv,
                        cudaStream_t stream) {
  check_ring(shape, step);
  tc_attention_backward(shape, layouts_of(step),
                        {.q = q,
                         .dout = dout,
                         .lse = lse,
                         .delta = delta,
                         .k = k,
                         .v = v,
                         .dq = dq_unscaled,
                         .dk = dk_unscaled,
                         .dv = dv,
                         .accumulate = true},
                        stream);
}

void scale_tensor(int64_t count, float factor, bf16* values, cudaStream_t stream) {
  detail::launch_with_large_shared(thread_per_item_launch(count), stream, scale_kernel, count,
                                   factor, values);
}

}  // namespace dhelix::cuda
