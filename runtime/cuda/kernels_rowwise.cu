// Row and element kernels of the CUDA backend (kernels_cuda.h): conversions, residual add,
// RMSNorm, RoPE, SwiGLU, vocabulary-parallel cross-entropy, embedding, AdamW.

#include <cuda_bf16.h>

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/kernels/cross_entropy.h"
#include "runtime/kernels/embedding.h"
#include "runtime/kernels/finite_check.h"
#include "runtime/kernels/rope.h"
#include "runtime/kernels/swiglu.h"

namespace dhelix::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;
using detail::launch;

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }
__device__ inline bf16 to_bf16(float value) { return __float2bfloat16_rn(value); }

// ---- Element kernels ------------------------------------------------------------------

__global__ void convert_to_bf16_kernel(int64_t count, const float* in, bf16* out) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) out[i] = to_bf16(in[i]);
}

__global__ void convert_to_f32_kernel(int64_t count, const bf16* in, float* out) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) out[i] = f32(in[i]);
}

__global__ void add_kernel(int64_t count, const bf16* a, const bf16* b, bf16* out) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    out[i] = to_bf16(f32(a[i]) + f32(b[i]));
  }
}

__global__ void accumulate_f32_kernel(int64_t count, const float* in, float* out) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) out[i] += in[i];
}

// Sets *flag to 1 when any value is inf or NaN (kernels::is_finite_value). Several blocks
// may store the same 1: the result does not depend on which.
__global__ void flag_non_finite_kernel(int64_t count, const float* values, int* flag) {
  int bad = 0;
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    bad |= kernels::is_finite_value(values[i]) ? 0 : 1;
  }
  if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) *flag = 1;
}

// ---- RMSNorm: a warp per row ------------------------------------------------------------

__global__ void rmsnorm_forward_kernel(int64_t rows, int64_t dim, const bf16* x, const float* gain,
                                       float eps, bf16* y, float* rstd) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int64_t row = global_thread() / kWarpSize; row < rows; row += grid_threads() / kWarpSize) {
    const bf16* xr = x + row * dim;
    float partial = 0.0f;
    for (int64_t i = lane; i < dim; i += kWarpSize) partial += f32(xr[i]) * f32(xr[i]);
    const float sum_squares = detail::warp_lane_tree_sum(partial);
    const float r = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
    for (int64_t i = lane; i < dim; i += kWarpSize)
      y[row * dim + i] = to_bf16(gain[i] * (f32(xr[i]) * r));
    if (lane == 0) rstd[row] = r;
  }
}

__global__ void rmsnorm_backward_kernel(int64_t rows, int64_t dim, const bf16* x, const float* gain,
                                        const float* rstd, const bf16* dy, bf16* dx) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int64_t row = global_thread() / kWarpSize; row < rows; row += grid_threads() / kWarpSize) {
    const bf16* xr = x + row * dim;
    const bf16* dyr = dy + row * dim;
    float partial = 0.0f;
    for (int64_t i = lane; i < dim; i += kWarpSize) partial += gain[i] * f32(dyr[i]) * f32(xr[i]);
    const float projection = detail::warp_lane_tree_sum(partial);
    const float r = rstd[row];
    const float coefficient = r * r * r * projection / static_cast<float>(dim);
    for (int64_t i = lane; i < dim; i += kWarpSize) {
      dx[row * dim + i] = to_bf16(r * (gain[i] * f32(dyr[i])) - f32(xr[i]) * coefficient);
    }
  }
}

// Two deterministic passes (kernels_cuda.h). Pass 1: block (column tile, chunk); each
// thread sums its column over the chunk's rows, ascending, into partial[chunk, col].
__global__ void rmsnorm_dgain_partial_kernel(int64_t rows, int64_t dim, int64_t rows_per_chunk,
                                             const bf16* x, const float* rstd, const bf16* dy,
                                             float* partial) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= dim) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    sum += f32(dy[r * dim + col]) * (f32(x[r * dim + col]) * rstd[r]);
  }
  partial[chunk * dim + col] = sum;
}

// Pass 2: a thread per column adds the chunks' sums to dgain, chunks ascending.
__global__ void column_sum_chunks_kernel(int64_t chunks, int64_t dim, const float* partial,
                                         float* out) {
  for (int64_t col = global_thread(); col < dim; col += grid_threads()) {
    float sum = out[col];
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * dim + col];
    out[col] = sum;
  }
}

// ---- RoPE: a thread per head vector -----------------------------------------------------

__global__ void rope_kernel(DeviceRopeTable table, int64_t seq, int64_t heads,
                            int64_t position_offset, int64_t vectors, bool backward, bf16* x) {
  float head[kMaxHeadDim];
  const int64_t hd = table.head_dim;
  const int64_t half = hd / 2;
  for (int64_t item = global_thread(); item < vectors; item += grid_threads()) {
    const int64_t token = item / heads;
    const int64_t position = position_offset + token % seq;
    bf16* xv = x + item * hd;
    for (int64_t d = 0; d < hd; ++d) head[d] = f32(xv[d]);
    const float* cos_row = table.cos + position * half;
    const float* sin_row = table.sin + position * half;
    if (backward) {
      kernels::rope_backward_head(hd, cos_row, sin_row, head);
    } else {
      kernels::rope_forward_head(hd, cos_row, sin_row, head);
    }
    for (int64_t d = 0; d < hd; ++d) xv[d] = to_bf16(head[d]);
  }
}

// ---- SwiGLU: a thread per output element ------------------------------------------------

__global__ void swiglu_forward_kernel(int64_t rows, int64_t ffn, const bf16* gate_up, bf16* out) {
  for (int64_t item = global_thread(); item < rows * ffn; item += grid_threads()) {
    const int64_t r = item / ffn;
    const int64_t i = item % ffn;
    const bf16* row = gate_up + r * 2 * ffn;
    out[item] = to_bf16(kernels::swiglu_forward(f32(row[i]), f32(row[ffn + i])));
  }
}

__global__ void swiglu_backward_kernel(int64_t rows, int64_t ffn, const bf16* gate_up,
                                       const bf16* dout, bf16* d_gate_up) {
  for (int64_t item = global_thread(); item < rows * ffn; item += grid_threads()) {
    const int64_t r = item / ffn;
    const int64_t i = item % ffn;
    const bf16* row = gate_up + r * 2 * ffn;
    float d_gate = 0.0f;
    float d_up = 0.0f;
    kernels::swiglu_backward(f32(row[i]), f32(row[ffn + i]), f32(dout[item]), &d_gate, &d_up);
    d_gate_up[r * 2 * ffn + i] = to_bf16(d_gate);
    d_gate_up[r * 2 * ffn + ffn + i] = to_bf16(d_up);
  }
}

// ---- Vocabulary-parallel cross-entropy ----------------------------------------------------

// A warp per row: the max (exact in any order), then the sum of exp in lane-tree order.
__global__ void vocab_stats_kernel(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                                   const bf16* logits, const int64_t* targets, float* stats) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int64_t row = global_thread() / kWarpSize; row < rows; row += grid_threads() / kWarpSize) {
    const bf16* z = logits + row * vocab_local;
    float m = -INFINITY;
    for (int64_t j = lane; j < vocab_local; j += kWarpSize) m = kernels::max_float(m, f32(z[j]));
    m = detail::warp_max(m);
    float partial = 0.0f;
    for (int64_t j = lane; j < vocab_local; j += kWarpSize) partial += expf(f32(z[j]) - m);
    const float sum = detail::warp_lane_tree_sum(partial);
    if (lane == 0) {
      float* out = stats + row * 3;
      out[0] = m;
      out[1] = vocab_local == 0 ? 0.0f : sum;
      const int64_t target = targets[row];
      const int64_t local = kernels::embedding_local_row(target, vocab_begin, vocab_local);
      out[2] = (target >= 0 && local >= 0) ? f32(z[local]) : 0.0f;
    }
  }
}

// A thread per row; the shards in order 0, 1, ... as cpu::vocab_parallel_combine.
__global__ void vocab_combine_kernel(int64_t rows, int64_t shards, int64_t shard_width,
                                     const float* stats, const int64_t* targets, float* lse,
                                     float* loss) {
  const int64_t block = rows * 3;
  for (int64_t r = global_thread(); r < rows; r += grid_threads()) {
    const float* row = stats + r * 3;
    float global_max = -INFINITY;
    for (int64_t s = 0; s < shards; ++s)
      global_max = kernels::max_float(global_max, row[s * block]);
    float sum = 0.0f;
    for (int64_t s = 0; s < shards; ++s) {
      if (row[s * block + 1] > 0.0f) sum += row[s * block + 1] * expf(row[s * block] - global_max);
    }
    lse[r] = global_max + logf(sum);
    const int64_t target = targets[r];
    const int64_t owner = target / shard_width;
    if (target < 0) {
      loss[r] = 0.0f;
    } else if (owner >= shards) {
      loss[r] = NAN;
    } else {
      loss[r] = lse[r] - row[owner * block + 2];
    }
  }
}

// A thread per logit: kernels::cross_entropy_backward_row on a one-column shard.
__global__ void vocab_backward_kernel(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                                      const bf16* logits, const int64_t* targets, const float* lse,
                                      float dloss, bf16* dlogits) {
  for (int64_t item = global_thread(); item < rows * vocab_local; item += grid_threads()) {
    const int64_t r = item / vocab_local;
    const int64_t j = item % vocab_local;
    const float z = f32(logits[item]);
    float dz = 0.0f;
    kernels::cross_entropy_backward_row(1, vocab_begin + j, &z, targets[r], lse[r], dloss, &dz);
    dlogits[item] = to_bf16(dz);
  }
}

// ---- Embedding (the backward: kernels_embedding.cu) ------------------------------------------

__global__ void embedding_forward_kernel(int64_t positions, int64_t dim, const int64_t* tokens,
                                         const bf16* table, int64_t vocab_begin,
                                         int64_t vocab_local, bf16* out) {
  for (int64_t item = global_thread(); item < positions * dim; item += grid_threads()) {
    const int64_t r = item / dim;
    const int64_t local = kernels::embedding_local_row(tokens[r], vocab_begin, vocab_local);
    out[item] = local < 0 ? to_bf16(0.0f) : table[local * dim + item % dim];
  }
}

// ---- AdamW ----------------------------------------------------------------------------------

__global__ void adamw_kernel(kernels::AdamWStep step, int64_t count, const float* grads,
                             float* params, float* m, float* v, bf16* params_bf16) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    float p = params[i];
    float first = m[i];
    float second = v[i];
    kernels::adamw_update(step, grads[i], &p, &first, &second);
    params[i] = p;
    m[i] = first;
    v[i] = second;
    if (params_bf16 != nullptr) params_bf16[i] = to_bf16(p);
  }
}

void check_workspace(const Workspace& workspace, int64_t needed, const char* op) {
  if (workspace.data != nullptr && workspace.bytes >= needed) return;
  throw Error(ErrorCode::kInternal,
              fmt::format("{}: the stream's workspace holds {} bytes, the op needs {}", op,
                          workspace.bytes, needed));
}

void check_rope(const DeviceRopeTable& table, int64_t seq, int64_t position_offset) {
  DHELIX_CHECK(table.head_dim >= 2 && table.head_dim % 2 == 0 && table.head_dim <= kMaxHeadDim);
  DHELIX_CHECK(position_offset >= 0 && position_offset + seq <= table.positions);
}

}  // namespace

int64_t column_reduction_workspace_bytes(int64_t rows, int64_t dim) {
  return column_chunks(rows) * dim * static_cast<int64_t>(sizeof(float));
}

std::vector<KernelEntry> rowwise_kernels() {
#define DHELIX_KERNEL(k) \
  KernelEntry { #k, reinterpret_cast < const void*>(&k) }
  return {DHELIX_KERNEL(convert_to_bf16_kernel),
          DHELIX_KERNEL(convert_to_f32_kernel),
          DHELIX_KERNEL(add_kernel),
          DHELIX_KERNEL(accumulate_f32_kernel),
          DHELIX_KERNEL(flag_non_finite_kernel),
          DHELIX_KERNEL(rmsnorm_forward_kernel),
          DHELIX_KERNEL(rmsnorm_backward_kernel),
          DHELIX_KERNEL(rmsnorm_dgain_partial_kernel),
          DHELIX_KERNEL(column_sum_chunks_kernel),
          DHELIX_KERNEL(rope_kernel),
          DHELIX_KERNEL(swiglu_forward_kernel),
          DHELIX_KERNEL(swiglu_backward_kernel),
          DHELIX_KERNEL(vocab_stats_kernel),
          DHELIX_KERNEL(vocab_combine_kernel),
          DHELIX_KERNEL(vocab_backward_kernel),
          DHELIX_KERNEL(embedding_forward_kernel),
          DHELIX_KERNEL(adamw_kernel)};
#undef DHELIX_KERNEL
}

void flag_non_finite(int64_t count, const float* values, int* flag, cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, flag_non_finite_kernel, count, values, flag);
}

void convert_to_bf16(int64_t count, const float* in, bf16* out, cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, convert_to_bf16_kernel, count, in, out);
}

void convert_to_f32(int64_t count, const bf16* in, float* out, cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, convert_to_f32_kernel, count, in, out);
}

void accumulate_f32(int64_t count, const float* in, float* out, cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, accumulate_f32_kernel, count, in, out);
}

void add_tensors(int64_t count, const bf16* a, const bf16* b, bf16* out, cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, add_kernel, count, a, b, out);
}

void rmsnorm_forward(int64_t rows, int64_t dim, const bf16* x, const float* gain, float eps,
                     bf16* y, float* rstd, cudaStream_t stream) {
  launch(warp_per_row_launch(rows), stream, rmsnorm_forward_kernel, rows, dim, x, gain, eps, y,
         rstd);
}

void rmsnorm_backward(int64_t rows, int64_t dim, const bf16* x, const float* gain,
                      const float* rstd, const bf16* dy, bf16* dx, float* dgain,
                      const Workspace& workspace, cudaStream_t stream) {
  launch(warp_per_row_launch(rows), stream, rmsnorm_backward_kernel, rows, dim, x, gain, rstd, dy,
         dx);
  if (rows == 0 || dim == 0) return;
  const int64_t chunks = column_chunks(rows);
  check_workspace(workspace, column_reduction_workspace_bytes(rows, dim), "rmsnorm_backward");
  auto* partial = static_cast<float*>(workspace.data);
  launch(column_partial_launch(rows, dim), stream, rmsnorm_dgain_partial_kernel, rows, dim,
         ceil_div(rows, chunks), x, rstd, dy, partial);
  launch(thread_per_item_launch(dim), stream, column_sum_chunks_kernel, chunks, dim, partial,
         dgain);
}

void rope_forward(const DeviceRopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                  int64_t position_offset, bf16* x, cudaStream_t stream) {
  check_rope(table, seq, position_offset);
  const int64_t vectors = batch * seq * heads;
  launch(thread_per_item_launch(vectors), stream, rope_kernel, table, seq, heads, position_offset,
         vectors, false, x);
}

void rope_backward(const DeviceRopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                   int64_t position_offset, bf16* dy, cudaStream_t stream) {
  check_rope(table, seq, position_offset);
  const int64_t vectors = batch * seq * heads;
  launch(thread_per_item_launch(vectors), stream, rope_kernel, table, seq, heads, position_offset,
         vectors, true, dy);
}

void swiglu_forward(int64_t rows, int64_t ffn, const bf16* gate_up, bf16* out,
                    cudaStream_t stream) {
  launch(thread_per_item_launch(rows * ffn), stream, swiglu_forward_kernel, rows, ffn, gate_up,
         out);
}

void swiglu_backward(int64_t rows, int64_t ffn, const bf16* gate_up, const bf16* dout,
                     bf16* d_gate_up, cudaStream_t stream) {
  launch(thread_per_item_launch(rows * ffn), stream, swiglu_backward_kernel, rows, ffn, gate_up,
         dout, d_gate_up);
}

void vocab_parallel_stats(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                          const bf16* logits, const int64_t* targets, float* stats,
                          cudaStream_t stream) {
  launch(warp_per_row_launch(rows), stream, vocab_stats_kernel, rows, vocab_local, vocab_begin,
         logits, targets, stats);
}

void vocab_parallel_combine(int64_t rows, int64_t shards, int64_t shard_width, const float* stats,
                            const int64_t* targets, float* lse, float* loss, cudaStream_t stream) {
  DHELIX_CHECK(shards >= 1 && shard_width >= 1);
  launch(thread_per_item_launch(rows), stream, vocab_combine_kernel, rows, shards, shard_width,
         stats, targets, lse, loss);
}

void vocab_parallel_backward(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                             const bf16* logits, const int64_t* targets, const float* lse,
                             float dloss, bf16* dlogits, cudaStream_t stream) {
  launch(thread_per_item_launch(rows * vocab_local), stream, vocab_backward_kernel, rows,
         vocab_local, vocab_begin, logits, targets, lse, dloss, dlogits);
}

void embedding_forward(int64_t positions, int64_t dim, const int64_t* tokens, const bf16* table,
                       int64_t vocab_begin, int64_t vocab_local, bf16* out, cudaStream_t stream) {
  launch(thread_per_item_launch(positions * dim), stream, embedding_forward_kernel, positions, dim,
         tokens, table, vocab_begin, vocab_local, out);
}

void adamw_update(const kernels::AdamWStep& step, int64_t count, const float* grads, float* params,
                  float* first_moment, float* second_moment, bf16* params_bf16,
                  cudaStream_t stream) {
  launch(thread_per_item_launch(count), stream, adamw_kernel, step, count, grads, params,
         first_moment, second_moment, params_bf16);
}

}  // namespace dhelix::cuda
