#pragma once
// Flash-style attention on the tensor cores (bf16 operands, fp32 accumulation), for the
// non-cuDNN causal attention (kernels_cuda.h: attention_forward / attention_backward) and
// for every ring step of context parallelism (ring_attention_cuda.h). One set of kernels
// serves both: a call names where its queries and its keys sit (kernels::AttentionLayouts),
// and query i sees key j when position(j) <= position(i).
//
//   kernel     block                                 warp                     partner tile
//   forward    4 warps: 64 queries of one head       16 query rows (mma M)    64 keys of K, V
//   dq         4 warps: 64 queries of one head       16 query rows            64 keys of K, V
//   dk/dv      W = min(group, 4) warps: 16 keys      the group's query heads  32 queries of q,
//              of one KV head (staged once)          w, w + W, ...            dout (L1/L2)
//
// Forward: S = Q K^T (mma.sync m16n8k16, K tile staged in shared memory as bf16), masked and
// scaled; the running max and sum are updated once per tile (online softmax, the lane
// quads' shuffles give the row max), and O += P V with P rounded to bf16 straight from the
// score registers (mma_bf16.cuh). O stays in registers: 4 x head_dim / 8 floats per lane
// (64 at head_dim 128), no per-thread arrays in local memory.
// Backward: delta_i = dout_i . out_i (one warp per row), then two passes that own their
// outputs, as before (docs/kernels.md, Determinism): dq per query slice over key tiles
// ascending; dk/dv per key slice, the group's query heads spread over the block's W warps
// (the GQA parallelism the grid over KV heads lacked), each warp summing its heads and
// query tiles in ascending order, then the warps' partial sums added through shared memory
// in ascending warp order (a second pass, no atomics: the same bits every run).
// Example: batch 1, seq 4096, heads 32, kv_heads 8, head_dim 128: forward and dq grids
// (64, 32, 1) of 128 threads with 2 x 64 x 136 x 2 = 34816 bytes of K/V tile; dk/dv grid
// (256, 8, 1) of 128 threads (group 4: one head per warp) with 2 x 16 x 136 x 2 = 8704
// bytes of K/V slice and 4 x 16 x 128 x 4 = 32768 of reduction buffer.
//
// The host twin (runtime/cpu/attention_tc_twin.h) runs the same tiles and roundings on the
// CPU; docs/kernels.md states the tolerances. Head dimensions are padded to 32, 64, 128 or
// 256 (zeros in the padding), one kernel instance each.
//
// Failure rules: shapes outside launch_config.h's limits throw Error(kUnsupported) before
// any launch (attention_launch); a layout whose runs do not fit the shape is a bug
// (DHELIX_CHECK); launch failures surface through DHELIX_CUDA_LAUNCHED.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "runtime/cuda/kernels_cuda.h"
#include "runtime/kernels/attention_layout.h"

namespace dhelix::cuda {

/// The kernels of kernels_attention_tc*.cu, for loading at set-up.
std::vector<KernelEntry> attention_tc_kernels();

/// Causal attention (causal layouts) in one call: out (bf16) and lse [batch, heads, seq].
void tc_attention_forward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                          const bf16* v, bf16* out, float* lse, cudaStream_t stream);

/// One ring step of the forward: folds k, v into stats[2 * batch * heads * seq] (max, sum
/// per row) and acc[batch, seq, heads, head_dim] (fp32, unnormalised).
void tc_attention_forward_step(const kernels::AttentionShape& shape,
                               const kernels::AttentionLayouts& layouts, const bf16* q,
                               const bf16* k, const bf16* v, float* stats, float* acc,
                               cudaStream_t stream);

/// delta[batch, heads, seq] = dout_i . out_i, one warp per row.
void tc_attention_delta(const kernels::AttentionShape& shape, const bf16* out, const bf16* dout,
                        float* delta, cudaStream_t stream);

/// The backward's two passes. accumulate = false (plain attention): dq, dk, dv are written,
/// scaled. accumulate = true (a ring step): dq, dk hold dq / scale, dk / scale and, with
/// dv, are added to (bf16 between steps).
struct TcBackward {
  const bf16* q = nullptr;
  const bf16* dout = nullptr;
  const float* lse = nullptr;
  const float* delta = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* dq = nullptr;
  bf16* dk = nullptr;
  bf16* dv = nullptr;
  bool accumulate = false;
};
void tc_attention_backward(const kernels::AttentionShape& shape,
                           const kernels::AttentionLayouts& layouts, const TcBackward& args,
                           cudaStream_t stream);

}  // namespace dhelix::cuda
