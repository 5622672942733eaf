#pragma once
// Ring attention of context parallelism on the GPU: the CUDA twin of
// runtime/cpu/ring_attention_cpu.h, with the same contracts, layouts and step semantics
// (read that file first), activations bf16 and every state and sum fp32.
//
// Each step runs the tensor-core flash kernels of attention_tc.h with the ring's layouts:
// the local queries at this rank's positions, the visiting block's keys at its owner's
// (kernels::cp_layout), the causal band being position(key) <= position(query), exactly
// runtime/kernels/context_parallel.h's visible_keys and first_seeing_query. Tiles follow
// the CPU's (the two local chunks of the visiting block in turn, tiles of 64 keys from each
// chunk's start); the mma products round P and dS to bf16, so GPU and CPU agree to the
// tolerance of docs/kernels.md, and the kernels' host twin (runtime/cpu/attention_tc_twin.h)
// reproduces those roundings on the CPU.
//
// State. The online softmax of every local query row (max, sum) and its unnormalised
// output live in device memory across the forward steps (RingDeviceState, allocated when
// the layer is bound; ring_forward_start resets it). The backward's dq (unscaled) and the
// visiting block's dk (unscaled), dv are bf16 buffers accumulated in place (+=): each step
// reads them, adds in fp32 and rounds once more; so dq and the dk, dv that travel the ring
// carry one bf16 rounding per step (cp of them), which the GPU tolerance of docs/kernels.md
// covers (the CPU sums in fp32).
//
// Every function enqueues on `stream` and returns; no host wait. Deterministic: no atomics,
// fixed tiles, so the same inputs give the same bits on every run.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/cpu/ring_attention_cpu.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

/// Online-softmax state of every local query row across one forward's steps, in device
/// memory: stats[2 * batch * heads * 2c] (max, sum per row, [batch, heads, 2c] order) and
/// acc[batch, 2c, heads, head_dim] (the unnormalised output), both fp32.
struct RingDeviceState {
  float* stats = nullptr;
  float* acc = nullptr;
};
/// Elements of RingDeviceState's buffers for `shape` (seq = 2c).
int64_t ring_state_stats_elements(const kernels::AttentionShape& shape);
int64_t ring_state_acc_elements(const kernels::AttentionShape& shape);

/// The kernels of kernels_ring_attention.cu, for loading at set-up.
std::vector<KernelEntry> ring_attention_kernels();

/// Empties the state (max = -inf, sum = 0, acc = 0) for a forward of `shape`.
void ring_forward_start(const kernels::AttentionShape& shape, RingDeviceState state,
                        cudaStream_t stream);
/// Folds the visiting block k, v (of CP rank step.block_rank) into the state of the local
/// queries q; cpu::ring_attention_forward_step.
void ring_forward_step(const kernels::AttentionShape& shape, const cpu::RingStep& step,
                       const bf16* q, const bf16* k, const bf16* v, RingDeviceState state,
                       cudaStream_t stream);
/// out (bf16) and lse (fp32) from the state after the last step.
void ring_forward_finish(const kernels::AttentionShape& shape, RingDeviceState state, bf16* out,
                         float* lse, cudaStream_t stream);
/// delta[batch, heads, 2c] = dout_i . out_i.
void ring_backward_delta(const kernels::AttentionShape& shape, const bf16* out, const bf16* dout,
                         float* delta, cudaStream_t stream);
/// Adds the visiting block's share to dq_unscaled and the local queries' share to the
/// block's dk_unscaled and dv (all +=); cpu::ring_attention_backward_step. Two kernels on
/// the stream: dq per query row, then dk/dv per key row.
void ring_backward_step(const kernels::AttentionShape& shape, const cpu::RingStep& step,
                        const bf16* q, const bf16* dout, const float* lse, const float* delta,
                        const bf16* k, const bf16* v, bf16* dq_unscaled, bf16* dk_unscaled,
                        bf16* dv, cudaStream_t stream);
/// values[count] *= factor in fp32, stored bf16 (the ring's closing scale of dq and dk).
void scale_tensor(int64_t count, float factor, bf16* values, cudaStream_t stream);

}  // namespace dhelix::cuda
