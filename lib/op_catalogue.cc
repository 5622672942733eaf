#include "lib/op_catalogue.h"

#include <array>
#include <utility>

#include <fmt/format.h>

// Signatures are the key a profile is looked up by, so their text is part of the profile
// format: change it only with a profile schema version bump.
//
//   GEMMs (gemm, grouped_gemm, head):  "gemm:bf16:m=8192,n=1280,k=8192"
//     No pass and no role: a dgrad and a forward GEMM of equal m, n, k do equal work, and
//     transposition is left out on purpose (cuBLAS picks equally fast kernels for NN/NT/TN).
//   other computation:                 "attention.bwd:bf16:b=1,h=8,g=1,q=4096,kv=4096,d=128,causal"
//                                      "norm.fwd:bf16:rmsnorm:m=512,n=8192"
//     The pass is kept: a norm's backward is not its forward.
//   communication:                     "all_gather:bf16:bytes=134217728:tp8:local"
//                                      "all_to_all:bf16:bytes=8388608:ep8:cross-node:nodes=2"
//     The pass is left out: an all-gather of N bytes costs the same in either pass.

namespace dhelix {
namespace {

bool is_gemm_like(OpKind kind) {
  return kind == OpKind::kGemm || kind == OpKind::kGroupedGemm || kind == OpKind::kHead;
}

std::string shape_fields(const Op& op) {
  const OpShape& s = op.shape;
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kHead:
    case OpKind::kRouter:
      return fmt::format("m={},n={},k={}", s.m, s.n, s.k);
    case OpKind::kGroupedGemm:
      return fmt::format("b={},m={},n={},k={}", s.batch, s.m, s.n, s.k);
    case OpKind::kAttention: {
      std::string text =
          fmt::format("b={},h={},g={},q={},kv={},d={},{}", s.batch, s.heads, s.kv_heads, s.q_len,
                      s.kv_len, s.head_dim, s.causal ? "causal" : "full");
      if (s.window > 0) text += fmt::format(",w={}", s.window);
      return text;
    }
    default:
      break;
  }
  // Elementwise, norms, permutations, embedding, loss, merge: rows x width, plus a third
  // extent and a batch only where the builder set them (embedding table rows, merge inputs).
  std::string text = fmt::format("m={},n={}", s.m, s.n);
  if (s.k != 0) text += fmt::format(",k={}", s.k);
  if (s.batch != 1) text += fmt::format(",b={}", s.batch);
  return text;
}

}  // namespace

const char* gemm_role_name(GemmRole role) {
  switch (role) {
    case GemmRole::kNone:
      return "none";
    case GemmRole::kForward:
      return "fwd";
    case GemmRole::kDgrad:
      return "dgrad";
    case GemmRole::kWgrad:
      return "wgrad";
  }
  return "?";
}

BackwardWork backward_work(const Op& op) {
  if (op.pass != Pass::kBackward) return BackwardWork::kNone;
  // FSDP's gradient reduce-scatter (lib/dag_builder_fsdp.cc), the one movable-sink
  // collective, reads the weight gradients: it belongs with them to W.
  const bool weight =
      op.gemm_role == GemmRole::kWgrad || (op.movable_sink && is_communication(op.kind));
  return weight ? BackwardWork::kWeightGradient : BackwardWork::kInputGradient;
}

bool is_communication(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kSendRecv:
      return true;
    default:
      return false;
  }
}

std::string Op::signature() const {
  if (is_communication(kind)) {
    std::string text =
        fmt::format("{}:{}:bytes={}:{}{}:{}", op_kind_name(kind), dtype_name(dtype), comm_bytes,
                    parallel_dim_name(group), group_size, group_scope_name(scope));
    if (scope == GroupScope::kCrossNode) text += fmt::format(":nodes={}", nodes_spanned);
    return text;
  }
  std::string head = op_kind_name(kind);
  if (!is_gemm_like(kind)) head += fmt::format(".{}", pass_name(pass));
  head += fmt::format(":{}", dtype_name(dtype));
  if (!variant.empty()) head += ":" + variant;
  return head + ":" + shape_fields(*this);
}

}  // namespace dhelix
