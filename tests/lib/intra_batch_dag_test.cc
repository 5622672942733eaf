// The intra-batch baseline's chunked layer DAGs (lib/dag_builder_intra_batch.h): op
// counts, edges of the tp = 2 worked example, chunk shapes, conservation of work, and
// equality with the normal DAGs where there is nothing to decompose.

#include "lib/dag_builder_intra_batch.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;
using testing::phi35_moe;
using Ids = std::vector<std::string>;

const Op& op_of(const LayerDag& dag, const std::string& id) {
  const auto index = dag.find(id);
  if (!index) ADD_FAILURE() << "no op " << id;
  return dag.op(index.value_or(0));
}

Ids neighbours(const LayerDag& dag, const std::string& id, bool predecessors) {
  const int64_t v = dag.find(id).value_or(-1);
  EXPECT_GE(v, 0) << "no op " << id;
  if (v < 0) return {};
  Ids ids;
  for (const int64_t u : predecessors ? dag.predecessors(v) : dag.successors(v)) {
    ids.push_back(dag.op(u).id);
  }
  return ids;
}
Ids preds(const LayerDag& dag, const std::string& id) { return neighbours(dag, id, true); }
Ids succs(const LayerDag& dag, const std::string& id) { return neighbours(dag, id, false); }

double gemm_flops(const LayerDag& dag) {
  double flops = 0;
  for (int64_t i = 0; i < dag.size(); ++i) {
    if (dag.op(i).kind == OpKind::kGemm) flops += dag.op(i).flops;
  }
  return flops;
}

JobSpec llama_sp(int64_t tp, int64_t seq = 8192, int64_t cp = 1) {
  return make_job(llama3_70b(), {.tp = tp, .cp = cp, .sp = true, .seq = seq});
}

TEST(IntraBatchDags, OpCountsGrowByTwoTpMinusThreePerPair) {
  // Four pairs per pass, each 2 ops -> 2·tp - 1: +4·(2·tp - 3) on 14 forward, 18 backward.
  struct Case {
    int64_t tp, forward, backward;
  };
  for (const Case c : {Case{2, 18, 22}, Case{4, 34, 38}, Case{8, 66, 70}}) {
    SCOPED_TRACE(c.tp);
    const LayerDags dags = build_intra_batch_layer_dags(llama_sp(c.tp), 0);
    EXPECT_EQ(dags.forward.size(), c.forward);
    EXPECT_EQ(dags.backward.size(), c.backward);
  }
  // CP ring kept as it is: tp8 cp2 normal 17 / 22 ops.
  const LayerDags cp = build_intra_batch_layer_dags(llama_sp(8, 16384, 2), 1);
  EXPECT_EQ(cp.forward.size(), 17 + 52);
  EXPECT_EQ(cp.backward.size(), 22 + 52);
  EXPECT_TRUE(cp.forward.find("fwd.kv_sendrecv0").has_value());
  // MoE with SP: only the attention half's TP gathers and scatters are decomposed; expert
  // tensor parallelism's (etp = tp = 2) stay whole (normal 19 / 24).
  const LayerDags moe = build_intra_batch_layer_dags(
      make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8, .sp = true}), 0);
  EXPECT_EQ(moe.forward.size(), 19 + 2);
  EXPECT_EQ(moe.backward.size(), 24 + 2);
  EXPECT_TRUE(moe.forward.find("fwd.etp_allgather").has_value());
  EXPECT_EQ(preds(moe.forward, "fwd.router"), Ids{"fwd.ln_mlp"});
}

TEST(IntraBatchDags, TpTwoForwardIsTheWorkedExample) {
  const LayerDags dags = build_intra_batch_layer_dags(llama_sp(2), 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(succs(f, "fwd.ln_attn"),
            (Ids{"fwd.allgather_attn.step1", "fwd.gemm_qkv.chunk0", "fwd.bda_attn"}));
  EXPECT_EQ(preds(f, "fwd.gemm_qkv.chunk1"),
            (Ids{"fwd.allgather_attn.step1", "fwd.gemm_qkv.chunk0"}));
  EXPECT_EQ(preds(f, "fwd.flash_attn"), Ids{"fwd.gemm_qkv.chunk1"});
  EXPECT_EQ(succs(f, "fwd.gemm_proj.chunk0"),
            (Ids{"fwd.reduce_scatter_attn.step1", "fwd.gemm_proj.chunk1"}));
  EXPECT_EQ(preds(f, "fwd.bda_attn"),
            (Ids{"fwd.ln_attn", "fwd.reduce_scatter_attn.step1", "fwd.gemm_proj.chunk1"}));
  EXPECT_EQ(preds(f, "fwd.gemm_fc1.chunk0"), Ids{"fwd.ln_mlp"});
  EXPECT_EQ(preds(f, "fwd.bda_mlp"),
            (Ids{"fwd.ln_mlp", "fwd.reduce_scatter_mlp.step1", "fwd.gemm_fc2.chunk1"}));
  EXPECT_FALSE(f.find("fwd.allgather_attn").has_value());
  EXPECT_FALSE(f.find("fwd.gemm_qkv").has_value());
  // Issue order: each step before the chunk it overlaps.
  Ids order;
  for (const int64_t v : f.topological_order()) order.push_back(f.op(v).id);
  EXPECT_EQ(order, (Ids{"fwd.ln_attn", "fwd.allgather_attn.step1", "fwd.gemm_qkv.chunk0",
                        "fwd.gemm_qkv.chunk1", "fwd.flash_attn", "fwd.gemm_proj.chunk0",
                        "fwd.reduce_scatter_attn.step1", "fwd.gemm_proj.chunk1", "fwd.bda_attn",
                        "fwd.ln_mlp", "fwd.allgather_mlp.step1", "fwd.gemm_fc1.chunk0",
                        "fwd.gemm_fc1.chunk1", "fwd.swiglu", "fwd.gemm_fc2.chunk0",
                        "fwd.reduce_scatter_mlp.step1", "fwd.gemm_fc2.chunk1", "fwd.bda_mlp"}));
}

TEST(IntraBatchDags, BackwardWgradsStayWholeAndWaitForTheFullGather) {
  const LayerDags dags = build_intra_batch_layer_dags(llama_sp(4), 0);
  const LayerDag& b = dags.backward;
  EXPECT_EQ(preds(b, "bwd.fc2_wgrad"), Ids{"bwd.allgather_mlp.step3"});
  EXPECT_EQ(preds(b, "bwd.proj_wgrad"), Ids{"bwd.allgather_attn.step3"});
  EXPECT_EQ(preds(b, "bwd.fc1_wgrad"), Ids{"bwd.swiglu"});
  EXPECT_EQ(op_of(b, "bwd.fc2_wgrad").shape.k, 8192);  // reduces over all T tokens
  EXPECT_EQ(preds(b, "bwd.allgather_mlp.step1"), Ids{"bwd.bda_mlp"});
  EXPECT_EQ(preds(b, "bwd.allgather_mlp.step2"), Ids{"bwd.allgather_mlp.step1"});
  EXPECT_EQ(preds(b, "bwd.fc2_dgrad.chunk0"), Ids{"bwd.bda_mlp"});
  EXPECT_EQ(preds(b, "bwd.fc2_dgrad.chunk2"),
            (Ids{"bwd.allgather_mlp.step2", "bwd.fc2_dgrad.chunk1"}));
  EXPECT_EQ(preds(b, "bwd.swiglu"), Ids{"bwd.fc2_dgrad.chunk3"});
  EXPECT_EQ(preds(b, "bwd.flash_attn"), Ids{"bwd.proj_dgrad.chunk3"});
  EXPECT_EQ(preds(b, "bwd.qkv_dgrad.chunk0"), Ids{"bwd.flash_attn"});
  EXPECT_EQ(preds(b, "bwd.reduce_scatter_attn.step2"),
            (Ids{"bwd.reduce_scatter_attn.step1", "bwd.qkv_dgrad.chunk1"}));
  EXPECT_EQ(preds(b, "bwd.ln_attn"),
            (Ids{"bwd.bda_attn", "bwd.reduce_scatter_attn.step3", "bwd.qkv_dgrad.chunk3"}));
  EXPECT_EQ(preds(b, "bwd.ln_mlp"), (Ids{"bwd.reduce_scatter_mlp.step3", "bwd.fc1_dgrad.chunk3"}));
}

TEST(IntraBatchDags, ChunksHaveATpthOfTheRowsAndStepsOneShard) {
  const LayerDags dags = build_intra_batch_layer_dags(llama_sp(8), 5);
  // T = 8192 tokens: chunks of 1024 rows; qkv n = 1024 + 2·128.
  const Op& qkv = op_of(dags.forward, "fwd.gemm_qkv.chunk7");
  EXPECT_EQ(qkv.kind, OpKind::kGemm);
  EXPECT_EQ(qkv.gemm_role, GemmRole::kForward);
  EXPECT_EQ(qkv.shape.m, 1024);
  EXPECT_EQ(qkv.shape.n, 1280);
  EXPECT_EQ(qkv.shape.k, 8192);
  EXPECT_EQ(qkv.flops, 2.0 * 1024 * 1280 * 8192);
  EXPECT_EQ(qkv.signature(), "gemm:bf16:m=1024,n=1280,k=8192");
  const Op& dgrad = op_of(dags.backward, "bwd.fc1_dgrad.chunk0");
  EXPECT_EQ(dgrad.gemm_role, GemmRole::kDgrad);
  EXPECT_EQ(dgrad.shape.m, 1024);
  EXPECT_EQ(dgrad.shape.n, 8192);
  EXPECT_EQ(dgrad.shape.k, 7168);
  // One shard: 1024 x 8192 bf16 = 16 MiB, over the node-local TP group of 8.
  for (const char* id : {"fwd.allgather_attn.step1", "fwd.reduce_scatter_mlp.step7"}) {
    SCOPED_TRACE(id);
    const Op& step = op_of(dags.forward, id);
    EXPECT_EQ(step.kind, OpKind::kSendRecv);
    EXPECT_EQ(step.comm_bytes, 1024LL * 8192 * 2);
    EXPECT_EQ(step.group, ParallelDim::kTp);
    EXPECT_EQ(step.group_size, 8);
    EXPECT_EQ(step.stream, StreamClass::kLocalComm);
    EXPECT_EQ(step.signature(), "send_recv:bf16:bytes=16777216:tp8:local");
  }
  EXPECT_FALSE(dags.forward.find("fwd.allgather_attn.step8").has_value());
  EXPECT_FALSE(dags.forward.find("fwd.gemm_qkv.chunk8").has_value());
}

TEST(IntraBatchDags, AcyclicWithCommBetweenProducerAndConsumerAndTheSameGemmWork) {
  for (const JobSpec& job : {llama_sp(2), llama_sp(4), llama_sp(8), llama_sp(8, 16384, 2)}) {
    SCOPED_TRACE(job.parallel.tp * 10 + job.parallel.cp);
    const LayerDags normal = build_layer_dags(job, 0);
    const LayerDags intra = build_intra_batch_layer_dags(job, 0);
    for (const LayerDag* dag : {&intra.forward, &intra.backward}) {
      EXPECT_TRUE(dag->is_acyclic());
      for (int64_t i = 0; i < dag->size(); ++i) {
        if (!is_communication(dag->op(i).kind)) continue;
        EXPECT_FALSE(dag->predecessors(i).empty()) << dag->op(i).id;
        EXPECT_FALSE(dag->successors(i).empty()) << dag->op(i).id;
      }
    }
    // The decomposition keeps the work: same GEMM flops per pass.
    EXPECT_DOUBLE_EQ(gemm_flops(intra.forward), gemm_flops(normal.forward));
    EXPECT_DOUBLE_EQ(gemm_flops(intra.backward), gemm_flops(normal.backward));
    EXPECT_GT(gemm_flops(intra.forward), 0);
  }
}

void expect_same_dags(const LayerDags& a, const LayerDags& b) {
  for (const auto& [x, y] : {std::pair{&a.forward, &b.forward}, {&a.backward, &b.backward}}) {
    ASSERT_EQ(x->size(), y->size());
    for (int64_t i = 0; i < x->size(); ++i) {
      EXPECT_EQ(x->op(i).id, y->op(i).id);
      EXPECT_EQ(x->op(i).signature(), y->op(i).signature());
      EXPECT_EQ(x->predecessors(i), y->predecessors(i));
    }
  }
}

TEST(IntraBatchDags, WithoutSequenceParallelismOrTpTheNormalDags) {
  for (const JobSpec& job :
       {make_job(llama3_70b(), {.tp = 8, .seq = 8192}), make_job(llama3_70b(), {.dp = 8}),
        make_job(llama3_70b(), {.cp = 2, .dp = 4})}) {
    SCOPED_TRACE(job.parallel.tp);
    expect_same_dags(build_intra_batch_layer_dags(job, 0), build_layer_dags(job, 0));
  }
}

}  // namespace
}  // namespace dhelix
