#pragma once
// What the cuda profiler backend launches for an Op (kind + per-rank shape), decided on the
// host without CUDA headers so that the choice is tested on machines without a GPU.
// profiler/cuda/cuda_op_runner.h turns the plan into an enqueue-able closure.
//
// Kind -> launch (shapes as lib/dag_builder_ops.cc fills them; row-major C[m, n]):
//   gemm, head, router    the runtime's own cuBLAS call for the op's role (the router's
//                         backward: its dgrad; runtime/cuda/
//                         device_setup.h, gemm_shape_of_role; issued by cublas_gemm.h's
//                         enqueue_gemm, as training issues it): bf16 operands, fp32
//                         accumulation, fwd C = A B^T, dgrad C = A B, wgrad C += A^T B into
//                         fp32 (beta 1: micro-batches accumulate)
//   grouped_gemm          that call once per expert, op.shape.batch of them one after
//                         another on distinct operands, as the runtime's MoE layer runs its
//                         local experts (runtime/model/moe_layers_padded.h)
//   attention             the attention dhelix-run runs: cuDNN's fused SDPA or
//                         runtime/cuda's causal GQA kernels, whichever dhelix-run's set-up
//                         picks for the shape (runtime/cuda/attention_path.h, decided by
//                         CudaOpRunner the same way), forward or backward, on
//                         the op's batch, heads, kv_heads, head_dim and q_len, bf16. A
//                         CP ring step (op id fwd/bwd.attn_stepN, q_len = kv_len even):
//                         the runtime's ring-step kernel (runtime/cuda/ring_attention_cuda.h,
//                         never cuDNN) on a representative step of CP 2, rank 0: its own
//                         block for step 0 (the causal diagonal), rank 1's for the others
//                         (half the block visible, as every off-diagonal step). Where
//                         those kernels do not apply (q_len != kv_len as under CP, not
//                         causal, a head_dim they refuse): APPROXIMATE, GEMMs of the op's
//                         FLOPs (m = batch * q_len rows, k = heads * head_dim, n = flops /
//                         (2 m k)), split into `repeats` launches of at most
//                         kMaxStandInColumns columns to bound memory
//   other compute ops     APPROXIMATE: a device-to-device copy of (bytes_read +
//                         bytes_written) / 2 bytes, which moves the op's memory traffic
//   all_gather            ncclAllGather, comm_bytes received (comm_bytes / n sent)
//   reduce_scatter        ncclReduceScatter, comm_bytes sent (comm_bytes / n received)
//   all_reduce            ncclAllReduce of comm_bytes
//   all_to_all            ncclSend/ncclRecv of comm_bytes / n to and from every member
//   send_recv             ncclSend of comm_bytes to the next member, ncclRecv from the
//                         previous (one ring step)
// Approximate stand-ins are listed in the profile's meta.measurement.approximate_ops.
// Element counts are comm_bytes / dtype size rounded down to a multiple of the group size.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/op_catalogue.h"
#include "runtime/cuda/device_api.h"

namespace dhelix::cuda_profile {

/// The most columns one attention stand-in GEMM has (bounds its output buffer).
inline constexpr int64_t kMaxStandInColumns = 16384;

enum class LaunchKind {
  kGemm,  ///< the runtime's cublasGemmEx, batch x repeats times
  kCopy,  ///< cudaMemcpyAsync device to device
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kSendRecv,
  kAttention,  ///< runtime/cuda's attention kernels
};
const char* launch_kind_name(LaunchKind kind);  ///< "gemm", "copy", "all_gather", ...

/// The runtime's GEMM call `call` (runtime/cuda/device_api.h), `batch` times one after
/// another over distinct operands, repeated `repeats` times on the same operands.
struct GemmLaunch {
  cuda::GemmShape call;
  int64_t batch = 1;
  int64_t repeats = 1;
};

/// One cuBLAS call of a GemmLaunch: the call on the operands at these element offsets of
/// the launch's A, B and C buffers (packed, one block per expert).
struct GemmCallAt {
  cuda::GemmShape call;
  int64_t a = 0, b = 0, c = 0;
  auto operator<=>(const GemmCallAt&) const = default;
};
/// Every call `launch` enqueues, in order: for each repeat, the call once per expert on the
/// expert's own operands (the runtime's MoE layer runs its local experts so, one GEMM
/// each); what the runner's closure issues.
std::vector<GemmCallAt> gemm_calls(const GemmLaunch& launch);

/// The attention kernels' launch: causal self-attention, layouts of
/// runtime/kernels/attention.h.
struct AttentionLaunch {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool backward = false;   ///< attention_backward (dq, dk, dv) instead of the forward
  bool ring_step = false;  ///< one CP ring step on seq = 2 chunks (ring_forward_step / ...)
  bool diagonal = true;    ///< ring step 0 (the rank's own block) rather than a later one
};

/// What to launch for one op.
struct OpLaunchPlan {
  LaunchKind kind = LaunchKind::kCopy;
  DType dtype = DType::kBf16;
  GemmLaunch gemm;            ///< kGemm
  AttentionLaunch attention;  ///< kAttention
  int64_t copy_bytes = 0;     ///< kCopy
  int64_t elements = 0;       ///< collectives: elements of the full buffer (see above)
  int64_t group_size = 1;     ///< collectives
  bool approximate = false;   ///< a stand-in, not the op's own kernel
  std::string stand_in;       ///< what was launched instead, for meta; "" when exact

  /// Bytes of device memory the launch's buffers take.
  int64_t device_bytes() const;
};

/// The launch for `op` (see the file comment). Throws Error(kUnsupported) for a
/// communication op whose group has fewer than 2 ranks (nothing to measure).
OpLaunchPlan plan_cuda_op(const Op& op);

}  // namespace dhelix::cuda_profile
