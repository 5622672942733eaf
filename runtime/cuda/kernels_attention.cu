// Causal GQA attention on the GPU (kernels_cuda.h), the path taken when cuDNN's fused
// attention is not available or refused (attention_path.h): the tensor-core flash kernels
// of attention_tc.h with the queries and keys both at positions 0 .. seq - 1.
//
// Forward: one launch writes out (bf16) and lse (fp32). Backward: delta_i = dout_i . out_i
// (one warp per row), then the dq pass and the dk/dv pass, each owning its outputs (no
// atomics: the same bits every run, docs/kernels.md).

#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/kernels_cuda.h"

namespace dhelix::cuda {

std::vector<KernelEntry> attention_kernels() { return attention_tc_kernels(); }

void attention_forward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                       const bf16* v, bf16* out, float* lse, cudaStream_t stream) {
  tc_attention_forward(shape, q, k, v, out, lse, stream);
}

void attention_backward(const kernels::AttentionShape& shape, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, const bf16* dout,
                        bf16* dq, bf16* dk, bf16* dv, float* delta, cudaStream_t stream) {
  // Same stream: the passes read the delta written first.
  tc_attention_delta(shape, out, dout, delta, stream);
  const kernels::TokenLayout causal = kernels::causal_layout(shape.seq);
  tc_attention_backward(shape, {causal, causal},
                        {.q = q,
                         .dout = dout,
                         .lse = lse,
                         .delta = delta,
                         .k = k,
                         .v = v,
                         .dq = dq,
                         .dk = dk,
                         .dv = dv,
                         .accumulate = false},
                        stream);
}

}  // namespace dhelix::cuda
