#include "lib/op_catalogue.h"

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

constexpr OpKind kAllKinds[] = {
    OpKind::kGemm,      OpKind::kGroupedGemm,    OpKind::kAttention,  OpKind::kAttentionMerge,
    OpKind::kNorm,      OpKind::kBiasDropoutAdd, OpKind::kActivation, OpKind::kRope,
    OpKind::kRouter,    OpKind::kPermute,        OpKind::kUnpermute,  OpKind::kEmbedding,
    OpKind::kHead,      OpKind::kLoss,           OpKind::kAllGather,  OpKind::kReduceScatter,
    OpKind::kAllReduce, OpKind::kAllToAll,       OpKind::kSendRecv};

TEST(OpCatalogue, KindNamesRoundTrip) {
  for (const OpKind kind : kAllKinds) {
    EXPECT_EQ(parse_op_kind(op_kind_name(kind)), kind) << op_kind_name(kind);
  }
  EXPECT_STREQ(op_kind_name(OpKind::kGroupedGemm), "grouped_gemm");
  EXPECT_STREQ(op_kind_name(OpKind::kBiasDropoutAdd), "bias_dropout_add");
  EXPECT_STREQ(op_kind_name(OpKind::kSendRecv), "send_recv");
  EXPECT_EQ(parse_op_kind("allgather"), std::nullopt);
  EXPECT_EQ(parse_op_kind(""), std::nullopt);
}

TEST(OpCatalogue, OtherNameTables) {
  EXPECT_STREQ(pass_name(Pass::kForward), "fwd");
  EXPECT_STREQ(pass_name(Pass::kBackward), "bwd");
  EXPECT_STREQ(gemm_role_name(GemmRole::kNone), "none");
  EXPECT_STREQ(gemm_role_name(GemmRole::kForward), "fwd");
  EXPECT_STREQ(gemm_role_name(GemmRole::kDgrad), "dgrad");
  EXPECT_STREQ(gemm_role_name(GemmRole::kWgrad), "wgrad");
  EXPECT_STREQ(stream_class_name(StreamClass::kCompute), "compute");
  EXPECT_STREQ(stream_class_name(StreamClass::kLocalComm), "local_comm");
  EXPECT_STREQ(stream_class_name(StreamClass::kCrossComm), "cross_comm");
}

TEST(OpCatalogue, ExactlyFiveKindsCommunicate) {
  int count = 0;
  for (const OpKind kind : kAllKinds) count += is_communication(kind) ? 1 : 0;
  EXPECT_EQ(count, 5);
  EXPECT_TRUE(is_communication(OpKind::kAllToAll));
  EXPECT_TRUE(is_communication(OpKind::kSendRecv));
  EXPECT_FALSE(is_communication(OpKind::kRouter));
}

Op gemm(int64_t m, int64_t n, int64_t k, GemmRole role, Pass pass) {
  Op op;
  op.kind = OpKind::kGemm;
  op.gemm_role = role;
  op.pass = pass;
  op.shape.m = m;
  op.shape.n = n;
  op.shape.k = k;
  return op;
}

TEST(OpSignature, GemmLeavesRoleAndPassOut) {
  const Op fwd = gemm(8192, 1280, 8192, GemmRole::kForward, Pass::kForward);
  EXPECT_EQ(fwd.signature(), "gemm:bf16:m=8192,n=1280,k=8192");
  EXPECT_EQ(gemm(8192, 1280, 8192, GemmRole::kDgrad, Pass::kBackward).signature(), fwd.signature());
  EXPECT_NE(gemm(8192, 1280, 4096, GemmRole::kForward, Pass::kForward).signature(),
            fwd.signature());
  Op fp16 = fwd;
  fp16.dtype = DType::kFp16;
  EXPECT_EQ(fp16.signature(), "gemm:fp16:m=8192,n=1280,k=8192");
  Op grouped = fwd;
  grouped.kind = OpKind::kGroupedGemm;
  grouped.shape.batch = 2;
  EXPECT_EQ(grouped.signature(), "grouped_gemm:bf16:b=2,m=8192,n=1280,k=8192");
}

TEST(OpSignature, ComputeKeepsPassVariantAndShape) {
  Op attention;
  attention.kind = OpKind::kAttention;
  attention.pass = Pass::kBackward;
  attention.shape = {.batch = 1,
                     .heads = 8,
                     .kv_heads = 1,
                     .q_len = 4096,
                     .kv_len = 4096,
                     .head_dim = 128,
                     .causal = true};
  EXPECT_EQ(attention.signature(), "attention.bwd:bf16:b=1,h=8,g=1,q=4096,kv=4096,d=128,causal");
  attention.shape.causal = false;
  EXPECT_EQ(attention.signature(), "attention.bwd:bf16:b=1,h=8,g=1,q=4096,kv=4096,d=128,full");
  Op norm;
  norm.kind = OpKind::kNorm;
  norm.variant = "rmsnorm";
  norm.shape.m = 512;
  norm.shape.n = 8192;
  EXPECT_EQ(norm.signature(), "norm.fwd:bf16:rmsnorm:m=512,n=8192");
  Op merge;
  merge.kind = OpKind::kAttentionMerge;
  merge.shape.m = 4096;
  merge.shape.n = 1024;
  merge.shape.batch = 4;
  EXPECT_EQ(merge.signature(), "attention_merge.fwd:bf16:m=4096,n=1024,b=4");
}

TEST(OpSignature, CommunicationNamesBytesGroupAndScope) {
  Op ag;
  ag.kind = OpKind::kAllGather;
  ag.comm_bytes = 134217728;
  ag.group = ParallelDim::kTp;
  ag.group_size = 8;
  EXPECT_EQ(ag.signature(), "all_gather:bf16:bytes=134217728:tp8:local");
  ag.pass = Pass::kBackward;
  EXPECT_EQ(ag.signature(), "all_gather:bf16:bytes=134217728:tp8:local");
  Op a2a;
  a2a.kind = OpKind::kAllToAll;
  a2a.comm_bytes = 8388608;
  a2a.group = ParallelDim::kEp;
  a2a.group_size = 8;
  a2a.scope = GroupScope::kCrossNode;
  a2a.nodes_spanned = 2;
  EXPECT_EQ(a2a.signature(), "all_to_all:bf16:bytes=8388608:ep8:cross-node:nodes=2");
  a2a.nodes_spanned = 4;
  EXPECT_EQ(a2a.signature(), "all_to_all:bf16:bytes=8388608:ep8:cross-node:nodes=4");
}

const Op& find_op(const LayerDag& dag, const std::string& id) {
  return dag.op(dag.find(id).value());
}

TEST(OpSignature, SameGemmInAnotherLayerOrRankSharesItsSignature) {
  const JobSpec job = make_job(llama3_70b(), {.tp = 8, .dp = 2, .sp = true});
  const LayerDags layer_a = build_layer_dags(job, 0);
  const LayerDags layer_b = build_layer_dags(job, 0);
  const LayerDags other_rank = build_layer_dags(job, 13);  // another node's TP group
  const std::string qkv = find_op(layer_a.forward, "fwd.gemm_qkv").signature();
  EXPECT_EQ(qkv, "gemm:bf16:m=4096,n=1280,k=8192");
  EXPECT_EQ(find_op(layer_b.forward, "fwd.gemm_qkv").signature(), qkv);
  EXPECT_EQ(find_op(other_rank.forward, "fwd.gemm_qkv").signature(), qkv);
  EXPECT_EQ(find_op(other_rank.forward, "fwd.allgather_attn").signature(),
            find_op(layer_a.forward, "fwd.allgather_attn").signature());
  // The gathers of both passes move the same buffer: one signature.
  EXPECT_EQ(find_op(layer_a.backward, "bwd.allgather_attn").signature(),
            find_op(layer_a.forward, "fwd.allgather_attn").signature());
  // Different shapes differ.
  EXPECT_NE(find_op(layer_a.forward, "fwd.gemm_proj").signature(), qkv);
  EXPECT_NE(find_op(layer_a.backward, "bwd.qkv_dgrad").signature(), qkv);
  EXPECT_NE(find_op(layer_a.backward, "bwd.qkv_wgrad").signature(), qkv);
  const LayerDags tp4 = build_layer_dags(make_job(llama3_70b(), {.tp = 4, .sp = true}), 0);
  EXPECT_EQ(find_op(tp4.forward, "fwd.gemm_qkv").signature(), "gemm:bf16:m=4096,n=2560,k=8192");
  EXPECT_NE(find_op(layer_a.forward, "fwd.ln_attn").signature(),
            find_op(layer_a.backward, "bwd.ln_attn").signature());
}

}  // namespace
}  // namespace dhelix
