#pragma once
// The operator catalogue: every kind of operator a transformer layer's forward and
// backward DAGs hold (the paper's Table 2 and more), and one operator instance with its
// per-rank shapes, work and placement. Layer DAGs (layer_dag.h) are graphs of these.
//
// An op's `signature()` names everything its run time depends on (kind, shape, dtype,
// group size and scope), not where it sits in the model: all 80 layers' QKV GEMMs share one
// signature, so a profile times it once and the planner looks it up by signature.

#include <cstdint>
#include <optional>
#include <string>

#include "lib/dtype.h"
#include "lib/enum_names.h"
#include "lib/parallel_spec.h"
#include "lib/placement.h"

namespace dhelix {

enum class OpKind {
  // computation
  kGemm,            ///< dense GEMM: forward, dgrad or wgrad (see GemmRole)
  kGroupedGemm,     ///< MoE experts' GEMMs as one grouped launch
  kAttention,       ///< flash-style attention core (one CP ring step when cp > 1)
  kAttentionMerge,  ///< merging partial softmax results of CP ring steps
  kNorm,            ///< RMSNorm / LayerNorm
  kBiasDropoutAdd,  ///< fused bias + dropout + residual add
  kActivation,      ///< SwiGLU / GeLU
  kRope,            ///< rotary position embedding
  kRouter,          ///< MoE router GEMM + softmax + top-k
  kPermute,         ///< MoE token permutation (gather into expert order)
  kUnpermute,       ///< MoE token un-permutation (scatter + weighted combine)
  kEmbedding,       ///< token embedding lookup (first stage)
  kHead,            ///< output projection to the vocabulary (last stage)
  kLoss,            ///< softmax cross-entropy (last stage)
  // communication
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kSendRecv,  ///< point-to-point exchange (CP ring step, pipeline transfer)
};

/// Forward or backward pass.
enum class Pass { kForward, kBackward };

/// For GEMMs: which product. Backward splits a forward GEMM into dgrad (gradient of the
/// input, on the critical path) and wgrad (gradient of the weight: a movable sink).
enum class GemmRole { kNone, kForward, kDgrad, kWgrad };

/// Which part of the model an op belongs to: a transformer layer, or the stage extras of
/// the first stage (the token embedding and its collectives) or of the last (final norm,
/// head, loss and their collectives). Set by the DAG builder; the lowering
/// (lib/plan/rank_program.h) places the extras by it.
enum class OpPart { kLayer, kEmbedding, kHead };
inline constexpr EnumNames<OpPart, 3> kOpPartNames{{"layer", "embedding", "head"}};

/// Which of the three streams of a rank runs the op (the paper's compute, local-node
/// communication and cross-node communication streams).
enum class StreamClass { kCompute, kLocalComm, kCrossComm };

/// Name tables (lib/enum_names.h), index = enum value: files and messages spell the enums so.
inline constexpr EnumNames<OpKind, 19> kOpKindNames{
    {"gemm", "grouped_gemm", "attention", "attention_merge", "norm", "bias_dropout_add",
     "activation", "rope", "router", "permute", "unpermute", "embedding", "head", "loss",
     "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv"}};
inline constexpr EnumNames<Pass, 2> kPassNames{{"fwd", "bwd"}};
inline constexpr EnumNames<StreamClass, 3> kStreamClassNames{
    {"compute", "local_comm", "cross_comm"}};

/// "gemm", "all_gather", ... (JSON and messages)
constexpr const char* op_kind_name(OpKind kind) { return kOpKindNames.name(kind); }
inline std::optional<OpKind> parse_op_kind(const std::string& name) {
  return kOpKindNames.parse(name);
}
constexpr const char* pass_name(Pass pass) { return kPassNames.name(pass); }  ///< "fwd", "bwd"
const char* gemm_role_name(GemmRole role);  ///< "none", "fwd", "dgrad", "wgrad"
/// "compute", "local_comm", "cross_comm"
constexpr const char* stream_class_name(StreamClass s) { return kStreamClassNames.name(s); }
bool is_communication(OpKind kind);

/// Per-rank shape of a computation. Which fields are meaningful depends on the kind:
/// GEMM: m x k times k x n (batch = 1; grouped GEMM: batch = local experts, m = tokens
/// per expert); attention: batch, heads, kv_heads, q_len, kv_len, head_dim, causal and
/// window (sliding-window attention: keys per query at most; 0 = no window);
/// elementwise and norms: elements (m = tokens, n = width).
struct OpShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  int64_t heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  bool causal = false;
  int64_t window = 0;
};

/// One operator instance of a layer's forward or backward pass, on one rank.
struct Op {
  std::string id;  ///< stable and unique within its DAG, e.g. "fwd.gemm_qkv", "bwd.fc1_wgrad"
  OpKind kind = OpKind::kGemm;
  Pass pass = Pass::kForward;
  GemmRole gemm_role = GemmRole::kNone;
  DType dtype = DType::kBf16;
  OpShape shape;
  double flops = 0;           ///< floating-point operations on this rank
  int64_t bytes_read = 0;     ///< device-memory bytes read (compute ops)
  int64_t bytes_written = 0;  ///< device-memory bytes written (compute ops)
  int64_t comm_bytes = 0;     ///< communication ops: bytes of the full (gathered) buffer
                              ///< per rank, as nccl-tests counts size; send/recv: bytes sent
  ParallelDim group = ParallelDim::kTp;   ///< communication ops: the process group
  int64_t group_size = 1;                 ///< communication ops: ranks in the group
  GroupScope scope = GroupScope::kLocal;  ///< communication ops: inside a node or across
  int64_t nodes_spanned = 1;              ///< communication ops: nodes the group's ranks live on
  StreamClass stream = StreamClass::kCompute;
  OpPart part = OpPart::kLayer;
  /// The implementation variant the kind alone does not name, because run time depends on
  /// it: norms "rmsnorm" | "layernorm", activations "swiglu" | "gelu", bias-dropout-add
  /// "bias" when the linear layers carry biases; "" otherwise.
  std::string variant;
  /// Weight-gradient GEMMs (and other ops nothing in the layer waits for): they may run
  /// anywhere after their inputs exist, up to the end of the layer's backward.
  bool movable_sink = false;

  /// What the run time depends on, e.g. "gemm:bf16:m=8192,n=1280,k=8192" or
  /// "all_gather:bf16:bytes=134217728:tp8:local". Equal signatures, equal times.
  std::string signature() const;
};

/// Which part of a layer's backward an op belongs to when the backward is split as the
/// zero-bubble schedules split it (Qi et al., ICLR 2024): the input-gradient work B (every
/// op the previous stage's backward waits for: dgrads, attention and norm backwards, the
/// collectives) or the weight-gradient work W (the wgrad GEMMs and grouped GEMMs, the
/// router's included, which only the optimizer step reads, and FSDP's gradient
/// reduce-scatter, which reads them). The DAG builder marks a wgrad where it makes the op
/// (make_wgrad: GemmRole::kWgrad, a movable sink); forward ops are kNone.
enum class BackwardWork { kNone, kInputGradient, kWeightGradient };
BackwardWork backward_work(const Op& op);

}  // namespace dhelix
