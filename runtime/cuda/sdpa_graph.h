#pragma once
// dhelix's causal GQA attention as a cuDNN operation graph, described as plain data (no
// cuDNN header) so that every dimension, stride, data type and node is unit-tested on a
// machine without a GPU; runtime/cuda/cudnn_sdpa.cc only turns this description into
// backend descriptors, one call per field.
//
// Why a graph of matmul, pointwise and reduction nodes and not the dedicated SDPA node.
// cuDNN 9.19's cudnn_graph_v9.h has CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (41) and
// _SDPA_BWD_DESCRIPTOR (43), but their attributes (CUDNN_ATTR_OPERATION_SDPA_FWD_* 2800-2810,
// _BWD_* 2851-2862) name Q, K, V, O, stats, scale, a block mask, page tables and sequence
// lengths, and no causal mask or diagonal band. The fused-attention pattern that cuDNN's
// runtime fusion engines match is the one NVIDIA's own cudnn-frontend emits for its
// "composite" SDPA nodes (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h,
// read for this file; nothing copied): two matmuls around a scale, a causal mask built from
// CUDNN_POINTWISE_GEN_INDEX (rows on axis 2, columns on axis 3), CUDNN_POINTWISE_CMP_GE and
// CUDNN_POINTWISE_BINARY_SELECT, and a softmax of reductions (MAX, ADD) and pointwise
// SUB/EXP/LOG/ADD/DIV. That graph is built here node for node.
//
// Layouts. dhelix's q, out, dq are [batch, seq, heads, head_dim] and k, v, dk, dv
// [batch, seq, kv_heads, head_dim] (runtime/kernels/attention.h); cuDNN's tensors are
// [b, h, s, d] with arbitrary strides, so dhelix's buffers are described in place, no copy:
//   Q, O, dO, dQ  dims {b, h, s, d}    strides {s*h*d, d, h*d, 1}
//   K^T           dims {b, g, d, s}    strides {s*g*d, d, 1, g*d}   (K read transposed)
//   V (fwd)       dims {b, g, s, d}    strides {s*g*d, d, g*d, 1}
//   V^T (bwd)     dims {b, g, d, s}    strides {s*g*d, d, 1, g*d}
//   stats         dims {b, h, s, 1}    strides {h*s, s, 1, 1}      (= dhelix's lse)
// Example, batch 1, seq 4, heads 2, kv_heads 1, head_dim 8: Q strides {64, 8, 16, 1},
// K^T dims {1, 1, 8, 4} strides {32, 8, 1, 8}, stats strides {8, 4, 1, 1}.
// Query head h reads key head h / (heads / kv_heads) in both (cuDNN broadcasts a K with
// fewer heads; the backward sums the per-query-head dK and dV of a group with a reduction
// node, as the frontend does for GQA).
//
// The statistics: cuDNN's stats = max + log(sum exp(s - max)) is dhelix's lse (natural log
// of the sum of exp of the scaled scores), so a forward on either path feeds a backward on
// either path. The backward's row sums dO . O ("softmax_sum") are a non-virtual fp32
// tensor {b, h, s, 1}: it is dhelix's delta buffer, which has exactly that shape.
//
// Determinism (dhelix-run --verify compares bits). The frontend's backward accumulates dQ
// in an fp32 buffer ("dQ_accum", atomics; the frontend's own comment) unless asked for its
// deterministic algorithm, when it writes dQ straight from the dS x K matmul (its "dP
// workspace" variant). sdpa_backward_graph(deterministic = true) builds that variant;
// cudnn_sdpa.cc further refuses engines whose CUDNN_ATTR_ENGINE_NUMERICAL_NOTE lists
// CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, and the set-up self-check runs the backward twice
// and requires equal bits (attention_path.h).
//
// Two forms of the graph. cuDNN's fusion engines match patterns, and the pattern the
// frontend emits changed with its release 1.8 (October 2024; compared node for node with
// the frontend's history, nothing copied):
//
//   node                        kCurrent (frontend 1.8 and later)   kLegacy (frontend <= 1.7)
//   GEN_INDEX math precision    float (the graph's compute type)    int32
//   backward causal mask        after subtracting the statistics    before subtracting them
//   non-deterministic dQ_accum  no reordering                       CUDNN_TENSOR_REORDERING_F16x16
//
// Neither form has a "dP x 1" node: both frontends scale dP only under dropout. Which form
// a given cuDNN build's engines accept is not documented, so CudnnSdpa::prepare() tries
// kCurrent, then kLegacy, and keeps the first that yields an engine (the self-check then
// compares its output with dhelix's kernel either way).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

/// Which frontend release's node pattern the graph follows (the table above).
enum class SdpaGraphForm { kCurrent, kLegacy };
/// The order CudnnSdpa::prepare() tries them in.
inline constexpr std::array<SdpaGraphForm, 2> kSdpaGraphForms{SdpaGraphForm::kCurrent,
                                                              SdpaGraphForm::kLegacy};
/// "current (frontend 1.8+)" | "legacy (frontend <= 1.7)", for refusals.
const char* sdpa_graph_form_name(SdpaGraphForm form);

/// Element types of the graph's tensors (cudnnDataType_t in cudnn_sdpa.cc).
enum class SdpaDtype { kBFloat16, kFloat32, kInt32, kBoolean };
/// The node kinds the graph uses (CUDNN_BACKEND_OPERATION_*_DESCRIPTOR).
enum class SdpaOpKind { kMatmul, kPointwise, kReduction, kReshape };
/// Pointwise modes (cudnnPointwiseMode_t) and reduction operators (cudnnReduceTensorOp_t).
enum class SdpaMode {
  kNone,
  kMul,
  kAdd,
  kSub,
  kDiv,
  kExp,
  kLog,
  kIdentity,
  kGenIndex,
  kCmpGe,
  kBinarySelect,
  kReduceMax,
  kReduceAdd
};

/// Fixed unique ids of the tensors the caller binds to memory.
enum SdpaUid : int64_t {
  kSdpaQ = 1,
  kSdpaK = 2,
  kSdpaV = 3,
  kSdpaO = 4,
  kSdpaStats = 5,
  kSdpaDO = 6,
  kSdpaDQ = 7,
  kSdpaDK = 8,
  kSdpaDV = 9,
  kSdpaSoftmaxSum = 10,  ///< dhelix's delta buffer
  kSdpaDQAccum = 11,     ///< fp32 scratch, non-deterministic backward only
};

/// One tensor descriptor. Scalars passed by value have dims and strides all 1; the
/// variant pack gives cuDNN a host pointer to `value` at execution.
struct SdpaTensor {
  int64_t uid = 0;
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  SdpaDtype dtype = SdpaDtype::kFloat32;
  bool is_virtual = false;
  bool by_value = false;
  float value = 0.0f;  ///< by_value scalars only
  /// CUDNN_ATTR_TENSOR_REORDERING_MODE = CUDNN_TENSOR_REORDERING_F16x16 (kLegacy's dQ_accum).
  bool reorder_f16x16 = false;
  bool operator==(const SdpaTensor&) const = default;
};

/// One node: y = op(x, b) (pointwise; t is the condition of BINARY_SELECT), C = A x B
/// (matmul: x = A, b = B), y = reduce(x) over the dimensions where y has extent 1 and x
/// does not, y = reshape(x). Unused inputs are 0. axis: GEN_INDEX's dimension.
struct SdpaOp {
  SdpaOpKind kind = SdpaOpKind::kPointwise;
  SdpaMode mode = SdpaMode::kNone;
  int64_t x = 0, b = 0, t = 0, y = 0;
  int64_t axis = -1;
  SdpaDtype compute = SdpaDtype::kFloat32;  ///< math precision / comparison type
  std::string name;                         ///< for errors and tests
};

/// A whole graph and what it needs beyond the engine's own workspace.
struct SdpaGraph {
  std::vector<SdpaTensor> tensors;
  std::vector<SdpaOp> ops;
  /// Non-virtual tensors the caller binds (ascending uid).
  std::vector<int64_t> bound_uids;
  /// Bytes of fp32 scratch for kSdpaDQAccum (0 when the graph has none).
  int64_t dq_accum_bytes = 0;

  /// The tensor with this uid; DHELIX_CHECKs that it exists.
  const SdpaTensor& tensor(int64_t uid) const;
};

/// What the masked scores are set to: -inf from cuDNN 9.10 on, the lowest float before
/// (the frontend's get_negative_inf_value; older engines mishandle -inf).
float sdpa_mask_value(int64_t cudnn_version);

/// Forward: O and stats from Q, K, V (causal, scale 1 / sqrt(head_dim)).
SdpaGraph sdpa_forward_graph(const kernels::AttentionShape& shape, int64_t cudnn_version,
                             SdpaGraphForm form = SdpaGraphForm::kCurrent);
/// Backward: dQ, dK, dV (overwritten) from Q, K, V, O, dO, stats; softmax_sum is written.
/// deterministic: dQ straight from its matmul (no kSdpaDQAccum).
SdpaGraph sdpa_backward_graph(const kernels::AttentionShape& shape, int64_t cudnn_version,
                              bool deterministic, SdpaGraphForm form = SdpaGraphForm::kCurrent);

}  // namespace dhelix::cuda
