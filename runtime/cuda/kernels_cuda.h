#pragma once
// The CUDA backend's kernels: the same contracts as the CPU backend's
// (runtime/cpu/kernels_cpu.h), with activations stored as bf16 and every sum in fp32.
//
// Precision: activations and their gradients (x, y, q, k, v, out, gate_up, logits, ...)
// are __nv_bfloat16; per-row statistics (rstd, lse, delta, the cross-entropy statistics),
// weight gradients (dgain, dtable) and the optimizer state are fp32. The RMSNorm gains are
// read from their fp32 master copy. AdamW updates the fp32 master weights and writes the
// bf16 copy the GEMMs read.
//
// The math is runtime/kernels/'s: the element and tile functions are called directly
// (SwiGLU, RoPE, AdamW, the attention tiles, the cross-entropy backward, the embedding's
// shard test) on fp32 values converted from bf16; the row sums of RMSNorm and the
// cross-entropy statistics use one warp per row whose xor-shuffle tree adds the pairs of
// kernels::lane_tree_sum in the same order. So the CPU tests cover the formulas, and GPU
// and CPU differ only by bf16 rounding, fused multiply-adds and CUDA's expf.
//
// Every function enqueues its kernels on `stream` and returns without waiting; a launch
// failure throws Error(kInternal) through DHELIX_CUDA. Shapes follow kernels_cpu.h;
// zero-sized shapes launch nothing. Launch shapes: launch_config.h.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/kernels/adamw.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

using bf16 = __nv_bfloat16;

// ---- Loading ---------------------------------------------------------------------------

/// One __global__ function of this backend, for loading at set-up (cuda_device_api.h).
struct KernelEntry {
  const char* name = "";
  const void* function = nullptr;
};
/// The kernels of kernels_rowwise.cu, kernels_embedding.cu, kernels_attention.cu and
/// kernels_delay.cu.
std::vector<KernelEntry> rowwise_kernels();
std::vector<KernelEntry> embedding_kernels();
std::vector<KernelEntry> attention_kernels();
std::vector<KernelEntry> delay_kernels();

/// Scratch device memory an op may use on its stream (ops of one stream run one after
/// another, so one workspace per stream is never shared by two running ops).
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
};
/// Workspace bytes the column reductions need for rows x dim (rmsnorm_backward) and for
/// `positions` (embedding_backward: the sort's keys and positions twice, its tile counts).
int64_t column_reduction_workspace_bytes(int64_t rows, int64_t dim);
int64_t embedding_backward_workspace_bytes(int64_t positions);

// ---- Conversions and plumbing ---------------------------------------------------------

/// out[count] = bf16(in), round to nearest even.
void convert_to_bf16(int64_t count, const float* in, bf16* out, cudaStream_t stream);
/// out[count] = float(in) (exact).
void convert_to_f32(int64_t count, const bf16* in, float* out, cudaStream_t stream);
/// *flag (device memory) = 1 when any of values[count] is inf or NaN
/// (kernels::is_finite_value); left as it was otherwise, so one zeroed flag serves any number
/// of calls (the per-step gradient check, cuda_engine.cc).
void flag_non_finite(int64_t count, const float* values, int* flag, cudaStream_t stream);
/// out[count] += in[count] in fp32, element by element (FSDP's sum of the reduced shards
/// in micro-batch order: runtime/model/fsdp_layers.h).
void accumulate_f32(int64_t count, const float* in, float* out, cudaStream_t stream);
/// out[count] = a + b in fp32, stored bf16 (the residual add); out may alias a or b.
void add_tensors(int64_t count, const bf16* a, const bf16* b, bf16* out, cudaStream_t stream);

/// Holds `stream` for about `microseconds` (one thread waiting on the GPU's global timer):
/// the delays of dhelix-run --jitter-us (runtime/exec/jitter.h). Nothing for <= 0.
void delay(int64_t microseconds, cudaStream_t stream);

// ---- Normalisation, position, activation ----------------------------------------------

/// y[rows, dim] = RMSNorm(x) * gain; rstd[rows] saved for the backward.
void rmsnorm_forward(int64_t rows, int64_t dim, const bf16* x, const float* gain, float eps,
                     bf16* y, float* rstd, cudaStream_t stream);
/// dx[rows, dim]; dgain[dim] accumulates (+=) in two deterministic passes, no atomics
/// (launch_config.h, column_chunks): each block of the first sums its column tile over one
/// chunk of rows, ascending, into `workspace`; the second adds the chunks' sums to dgain in
/// chunk order. Same bits every run; workspace holds column_reduction_workspace_bytes.
void rmsnorm_backward(int64_t rows, int64_t dim, const bf16* x, const float* gain,
                      const float* rstd, const bf16* dy, bf16* dx, float* dgain,
                      const Workspace& workspace, cudaStream_t stream);

/// A RoPE table in device memory: cos and sin, each [positions, head_dim / 2], fp32 (built
/// on the host by cpu::make_rope_table and copied, so both backends use the same table).
struct DeviceRopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t positions = 0;
  int64_t head_dim = 0;  ///< even, <= kMaxHeadDim
};
/// Rotates x[batch, seq, heads, head_dim] in place (positions position_offset + t).
void rope_forward(const DeviceRopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                  int64_t position_offset, bf16* x, cudaStream_t stream);
/// Inverse rotation of dy in place.
void rope_backward(const DeviceRopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                   int64_t position_offset, bf16* dy, cudaStream_t stream);

/// out[rows, ffn] = silu(gate) * up from gate_up[rows, 2 * ffn].
void swiglu_forward(int64_t rows, int64_t ffn, const bf16* gate_up, bf16* out, cudaStream_t stream);
/// d_gate_up[rows, 2 * ffn] from gate_up and dout[rows, ffn].
void swiglu_backward(int64_t rows, int64_t ffn, const bf16* gate_up, const bf16* dout,
                     bf16* d_gate_up, cudaStream_t stream);

// ---- Attention ------------------------------------------------------------------------

/// Causal GQA flash attention forward (layouts in runtime/kernels/attention.h), key tiles
/// of kernels::kAttentionTileKeys: writes out (bf16) and lse[batch, heads, seq] (fp32).
void attention_forward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                       const bf16* v, bf16* out, float* lse, cudaStream_t stream);
/// Backward: dq, dk, dv (overwritten) in two passes that own their outputs (dq per query
/// row, then dk/dv per key row); delta[batch, heads, seq] is fp32 scratch the first pass
/// fills and the second reads.
void attention_backward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, const bf16* dout,
                        bf16* dq, bf16* dk, bf16* dv, float* delta, cudaStream_t stream);

// ---- Vocabulary-parallel cross-entropy, embedding, optimizer ---------------------------

/// stats[rows, 3] (max, sum of exp(z - max), target logit or 0) of this shard's
/// logits[rows, vocab_local], columns vocab_begin onwards; cpu::vocab_parallel_stats.
void vocab_parallel_stats(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                          const bf16* logits, const int64_t* targets, float* stats,
                          cudaStream_t stream);
/// lse[rows] and loss[rows] from the all-gathered stats[shards][rows, 3], shards folded in
/// order; cpu::vocab_parallel_combine. A target beyond the shards gives a NaN loss.
void vocab_parallel_combine(int64_t rows, int64_t shards, int64_t shard_width, const float* stats,
                            const int64_t* targets, float* lse, float* loss, cudaStream_t stream);
/// dlogits[rows, vocab_local] = dloss * (softmax - one_hot); cpu::vocab_parallel_backward.
void vocab_parallel_backward(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                             const bf16* logits, const int64_t* targets, const float* lse,
                             float dloss, bf16* dlogits, cudaStream_t stream);

/// out[positions, dim] gathered from table[vocab_local, dim] (zeros for other shards).
void embedding_forward(int64_t positions, int64_t dim, const int64_t* tokens, const bf16* table,
                       int64_t vocab_begin, int64_t vocab_local, bf16* out, cudaStream_t stream);
/// dtable[vocab_local, dim] (fp32) += scatter of dout, deterministic, no atomics
/// (kernels_embedding.cu, with a worked example): the positions sorted stably by token (a
/// radix sort, O(P) per 8-bit digit), then every (run of one token, column) a thread that
/// adds the run's rows, positions ascending: the CPU's order, so the same fp32 sums.
/// workspace holds embedding_backward_workspace_bytes.
void embedding_backward(int64_t positions, int64_t dim, const int64_t* tokens, const bf16* dout,
                        int64_t vocab_begin, int64_t vocab_local, float* dtable,
                        const Workspace& workspace, cudaStream_t stream);

/// One AdamW step over count fp32 master weights; writes their bf16 copy when params_bf16
/// is not null.
void adamw_update(const kernels::AdamWStep& step, int64_t count, const float* grads, float* params,
                  float* first_moment, float* second_moment, bf16* params_bf16,
                  cudaStream_t stream);

}  // namespace dhelix::cuda
