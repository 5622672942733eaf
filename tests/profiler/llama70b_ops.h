#pragma once
// Hand-built per-rank ops of Llama-70B (hidden 8192, 64 heads, 8 KV heads, head_dim 128,
// SwiGLU FFN 28672) under TP8 with sequence parallelism, sequence 4096, micro-batch 1:
// the operators of the DHelix paper's Figure 4, for the cost-model tests and the OEF table
// of docs/cost-model.md. Hand-built so the tests do not depend on the DAG builder.

#include <cstdint>

#include "lib/cluster_spec.h"
#include "lib/op_catalogue.h"

namespace dhelix::test {

inline constexpr int64_t kTokens = 4096;
inline constexpr int64_t kHidden = 8192;
/// One full activation [tokens, hidden] in bf16: 4096 * 8192 * 2 = 67,108,864 bytes.
inline constexpr int64_t kActivationBytes = kTokens * kHidden * 2;

inline Op gemm_op(const char* id, int64_t m, int64_t n, int64_t k) {
  Op op;
  op.id = id;
  op.kind = OpKind::kGemm;
  op.gemm_role = GemmRole::kForward;
  op.shape.m = m;
  op.shape.n = n;
  op.shape.k = k;
  op.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  op.bytes_read = 2 * (m * k + k * n);
  op.bytes_written = 2 * m * n;
  return op;
}

/// FC1 of the SwiGLU MLP: 4096 x 8192 times 8192 x (2 * 28672 / 8 = 7168).
inline Op fc1_gemm() { return gemm_op("fwd.fc1", kTokens, 7168, kHidden); }

/// Flash attention over 8 local heads (1 KV head), 4096 x 4096, causal.
inline Op flash_attention(Pass pass) {
  Op op;
  op.id = pass == Pass::kForward ? "fwd.attention" : "bwd.attention";
  op.kind = OpKind::kAttention;
  op.pass = pass;
  op.shape.batch = 1;
  op.shape.heads = 8;
  op.shape.kv_heads = 1;
  op.shape.q_len = kTokens;
  op.shape.kv_len = kTokens;
  op.shape.head_dim = 128;
  op.shape.causal = true;
  op.bytes_read = 10 << 20;  // q 8 MiB, k and v 1 MiB each
  op.bytes_written = 8 << 20;
  return op;
}

/// RMSNorm over the sequence-parallel shard would be small; this is a full-width one
/// reading and writing one activation each (memory-bound).
inline Op norm_op() {
  Op op;
  op.id = "fwd.norm";
  op.kind = OpKind::kNorm;
  op.shape.m = kTokens;
  op.shape.n = kHidden;
  op.bytes_read = kActivationBytes;
  op.bytes_written = kActivationBytes;
  return op;
}

inline Op comm_op(const char* id, OpKind kind, int64_t bytes, int64_t group, GroupScope scope,
                  int64_t nodes) {
  Op op;
  op.id = id;
  op.kind = kind;
  op.comm_bytes = bytes;
  op.group_size = group;
  op.scope = scope;
  op.nodes_spanned = nodes;
  op.group = scope == GroupScope::kLocal ? ParallelDim::kTp : ParallelDim::kEp;
  op.stream = scope == GroupScope::kLocal ? StreamClass::kLocalComm : StreamClass::kCrossComm;
  return op;
}

/// The paper's C1: SP all-gather of one activation over the 8 local TP ranks.
inline Op local_all_gather() {
  return comm_op("fwd.ag_qkv", OpKind::kAllGather, kActivationBytes, 8, GroupScope::kLocal, 1);
}

/// The paper's C2: a cross-node all-to-all over 8 ranks on 8 nodes (EP), one activation.
inline Op cross_all_to_all() {
  return comm_op("fwd.a2a_dispatch", OpKind::kAllToAll, kActivationBytes, 8, GroupScope::kCrossNode,
                 8);
}

/// An A100-like GPU with round figures for the hand-computed cases.
inline GpuSpec a100_like_gpu() {
  GpuSpec gpu;
  gpu.name = "A100-like";
  gpu.peak_bf16_tflops = 312;
  gpu.memory_bandwidth_gbps = 2039;
  gpu.sm_count = 108;
  gpu.gemm_efficiency = 0.84;
  gpu.attention_efficiency = 0.57;
  gpu.memory_efficiency = 0.85;
  return gpu;
}

/// An 8-GPU NVLink node with round figures: bus bandwidth 232 GB/s, alpha 9 us; one 25 GB/s
/// NIC per 2 GPUs with alpha 5 us.
inline ClusterSpec a100_like_cluster() {
  ClusterSpec cluster;
  cluster.name = "a100-like";
  cluster.gpu = a100_like_gpu();
  cluster.gpus_per_node = 8;
  cluster.intra_node = {LinkKind::kNvLink, 300, 232, 9.0, ""};
  cluster.inter_node = {LinkKind::kInfiniBand, 25, 24, 5.0, ""};
  cluster.nics_per_node = 4;
  cluster.nccl_sms_intra_node = 16;
  cluster.nccl_sms_inter_node = 8;
  cluster.nccl_memory_traffic_factor = 2.5;
  return cluster;
}

}  // namespace dhelix::test
