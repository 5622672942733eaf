#include "lib/layer_dag.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "lib/dag_export.h"
#include "lib/error.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::gpt_style;
using testing::llama3_70b;
using testing::make_job;
using testing::phi35_moe;
using testing::Shape;
using Ids = std::vector<std::string>;

Op named(const std::string& id) {
  Op op;
  op.id = id;
  return op;
}

Ids topological_ids(const LayerDag& dag) {
  Ids ids;
  for (const int64_t i : dag.topological_order()) ids.push_back(dag.op(i).id);
  return ids;
}

Ids index_ids(const LayerDag& dag, const std::vector<int64_t>& indices) {
  Ids ids;
  for (const int64_t i : indices) ids.push_back(dag.op(i).id);
  return ids;
}

Ids predecessors(const LayerDag& dag, const std::string& id) {
  return index_ids(dag, dag.predecessors(*dag.find(id)));
}

Ids successors(const LayerDag& dag, const std::string& id) {
  return index_ids(dag, dag.successors(*dag.find(id)));
}

const Op& op_of(const LayerDag& dag, const std::string& id) {
  const auto index = dag.find(id);
  EXPECT_TRUE(index.has_value()) << id;
  return dag.op(index.value_or(0));
}

// Whether `to` depends on `from` through any path.
bool reaches(const LayerDag& dag, const std::string& from, const std::string& to) {
  std::vector<int64_t> stack = {*dag.find(from)};
  std::set<int64_t> seen;
  const int64_t target = *dag.find(to);
  while (!stack.empty()) {
    const int64_t v = stack.back();
    stack.pop_back();
    if (v == target) return true;
    if (!seen.insert(v).second) continue;
    for (const int64_t w : dag.successors(v)) stack.push_back(w);
  }
  return false;
}

// ---------------------------------------------------------------- the graph class

TEST(LayerDag, AddFindAndNeighboursInAscendingOrder) {
  LayerDag dag;
  EXPECT_EQ(dag.add_op(named("a")), 0);
  EXPECT_EQ(dag.add_op(named("b")), 1);
  EXPECT_EQ(dag.add_op(named("c")), 2);
  dag.add_edge(0, 2);
  dag.add_edge(0, 1);
  dag.add_edge(0, 1);  // a duplicate is ignored
  dag.add_edge(1, 2);
  EXPECT_EQ(dag.size(), 3);
  EXPECT_EQ(dag.find("b"), 1);
  EXPECT_EQ(dag.find("z"), std::nullopt);
  EXPECT_EQ(dag.successors(0), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(dag.predecessors(2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(boost::num_edges(dag.graph()), 3u);
  dag.mutable_op(1).flops = 5;
  EXPECT_EQ(dag.op(1).flops, 5);
}

TEST(LayerDag, TopologicalOrderTakesSmallestReadyIndexFirst) {
  // 0 -> 3, 1 -> 2, 2 -> 3, and 4 free: ready {0,1,4} -> 0; {1,4} -> 1; {2,4} -> 2; {3,4} -> 3.
  LayerDag dag;
  for (const char* id : {"a", "b", "c", "d", "e"}) dag.add_op(named(id));
  dag.add_edge(0, 3);
  dag.add_edge(1, 2);
  dag.add_edge(2, 3);
  EXPECT_EQ(dag.topological_order(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  LayerDag reversed;
  for (const char* id : {"a", "b", "c"}) reversed.add_op(named(id));
  reversed.add_edge(2, 1);
  reversed.add_edge(1, 0);
  EXPECT_EQ(reversed.topological_order(), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_TRUE(reversed.is_acyclic());
}

TEST(LayerDag, DetectsCycles) {
  LayerDag dag;
  for (const char* id : {"a", "b", "c"}) dag.add_op(named(id));
  dag.add_edge(0, 1);
  dag.add_edge(1, 2);
  EXPECT_TRUE(dag.is_acyclic());
  dag.add_edge(2, 1);
  EXPECT_FALSE(dag.is_acyclic());
}

TEST(LayerDagDeathTest, DuplicateIdAborts) {
  LayerDag dag;
  dag.add_op(named("a"));
  EXPECT_DEATH(dag.add_op(named("a")), "duplicate op id a");
}

// ---------------------------------------------------------------- every configuration

struct Config {
  std::string name;
  JobSpec job;
  int64_t rank;
  int64_t forward_ops, backward_ops;
};

std::vector<Config> configurations() {
  return {
      {"dense tp8 sp", make_job(llama3_70b(), {.tp = 8, .sp = true, .seq = 8192}), 3, 14, 18},
      {"dense tp8 no sp", make_job(llama3_70b(), {.tp = 8, .seq = 8192}), 0, 12, 16},
      {"dense tp1", make_job(llama3_70b(), {.dp = 8}), 5, 10, 14},
      {"dense tp8 sp cp2", make_job(llama3_70b(), {.tp = 8, .cp = 2, .sp = true, .seq = 16384}), 9,
       17, 22},
      {"dense tp8 sp cp4", make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768}), 0,
       21, 26},
      {"dense tp1 cp2", make_job(llama3_70b(), {.cp = 2, .dp = 4}), 1, 13, 18},
      {"moe tp1 ep8", make_job(phi35_moe(), {.dp = 8, .ep = 8}), 2, 15, 20},
      // expert tensor parallelism (etp = tp = 2): an all-gather and a reduce-scatter each way
      {"moe tp2 sp ep8", make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8, .sp = true}), 3, 19, 24},
      {"moe tp1 ep1", make_job(phi35_moe(), {.dp = 8}), 0, 13, 18},
      {"moe tp2 sp cp2 ep2",
       make_job(phi35_moe(), {.tp = 2, .cp = 2, .dp = 2, .ep = 2, .sp = true, .seq = 8192}), 0, 22,
       28},
      {"gpt tp4 sp", make_job(gpt_style(), {.tp = 4, .dp = 2, .sp = true}), 0, 14, 18},
  };
}

TEST(LayerDags, OpCountsPerConfiguration) {
  for (const Config& c : configurations()) {
    SCOPED_TRACE(c.name);
    const LayerDags dags = build_layer_dags(c.job, c.rank);
    EXPECT_EQ(dags.forward.size(), c.forward_ops);
    EXPECT_EQ(dags.backward.size(), c.backward_ops);
  }
}

TEST(LayerDags, EveryConfigurationIsAcyclicWithOneEntryAndOneExit) {
  for (const Config& c : configurations()) {
    SCOPED_TRACE(c.name);
    const LayerDags dags = build_layer_dags(c.job, c.rank);
    for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
      EXPECT_TRUE(dag->is_acyclic());
      Ids sources, sinks;
      for (int64_t i = 0; i < dag->size(); ++i) {
        if (dag->predecessors(i).empty()) sources.push_back(dag->op(i).id);
        if (dag->successors(i).empty() && !dag->op(i).movable_sink) sinks.push_back(dag->op(i).id);
      }
      const bool forward = dag == &dags.forward;
      EXPECT_EQ(sources, Ids{forward ? "fwd.ln_attn" : "bwd.bda_mlp"});
      EXPECT_EQ(sinks, Ids{forward ? "fwd.bda_mlp" : "bwd.ln_attn"});
    }
  }
}

TEST(LayerDags, CommunicationOpsHaveProducerConsumerAndStreamFromScope) {
  for (const Config& c : configurations()) {
    SCOPED_TRACE(c.name);
    const LayerDags dags = build_layer_dags(c.job, c.rank);
    for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
      for (int64_t i = 0; i < dag->size(); ++i) {
        const Op& op = dag->op(i);
        SCOPED_TRACE(op.id);
        if (!is_communication(op.kind)) {
          EXPECT_EQ(op.stream, StreamClass::kCompute);
          EXPECT_EQ(op.comm_bytes, 0);
          continue;
        }
        EXPECT_FALSE(dag->predecessors(i).empty());
        EXPECT_FALSE(dag->successors(i).empty());
        EXPECT_GT(op.comm_bytes, 0);
        EXPECT_GT(op.group_size, 1);
        EXPECT_EQ(op.stream, op.scope == GroupScope::kLocal ? StreamClass::kLocalComm
                                                            : StreamClass::kCrossComm);
        EXPECT_EQ(op.nodes_spanned > 1, op.scope == GroupScope::kCrossNode);
      }
    }
  }
}

TEST(LayerDags, MovableSinksAreExactlyTheWeightGradients) {
  for (const Config& c : configurations()) {
    SCOPED_TRACE(c.name);
    const LayerDags dags = build_layer_dags(c.job, c.rank);
    for (int64_t i = 0; i < dags.forward.size(); ++i) {
      EXPECT_FALSE(dags.forward.op(i).movable_sink);
      EXPECT_EQ(dags.forward.op(i).pass, Pass::kForward);
    }
    Ids sinks;
    for (int64_t i = 0; i < dags.backward.size(); ++i) {
      const Op& op = dags.backward.op(i);
      EXPECT_EQ(op.pass, Pass::kBackward);
      EXPECT_EQ(op.movable_sink, op.gemm_role == GemmRole::kWgrad) << op.id;
      if (!op.movable_sink) continue;
      EXPECT_TRUE(dags.backward.successors(i).empty()) << op.id;
      sinks.push_back(op.id);
    }
    const Ids expected =
        c.job.model.is_moe()
            ? Ids{"bwd.grouped_fc2_wgrad", "bwd.grouped_fc1_wgrad", "bwd.router_wgrad",
                  "bwd.proj_wgrad", "bwd.qkv_wgrad"}
            : Ids{"bwd.fc2_wgrad", "bwd.fc1_wgrad", "bwd.proj_wgrad", "bwd.qkv_wgrad"};
    EXPECT_EQ(sinks, expected);
  }
}

TEST(LayerDags, BackwardSplitsIntoInputAndWeightGradientWork) {
  // The zero-bubble split (backward_work): W is every wgrad, one per weighted forward GEMM
  // (router and grouped expert GEMMs included), and nothing of B waits for any of it.
  for (const Config& c : configurations()) {
    SCOPED_TRACE(c.name);
    const LayerDags dags = build_layer_dags(c.job, c.rank);
    int64_t weighted_forward = 0;
    for (int64_t i = 0; i < dags.forward.size(); ++i) {
      const Op& op = dags.forward.op(i);
      EXPECT_EQ(backward_work(op), BackwardWork::kNone) << op.id;
      const bool gemm = op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm;
      if ((gemm && op.gemm_role == GemmRole::kForward) || op.kind == OpKind::kRouter) {
        weighted_forward += 1;
      }
    }
    int64_t weight_work = 0;
    for (int64_t i = 0; i < dags.backward.size(); ++i) {
      const Op& op = dags.backward.op(i);
      const BackwardWork work = backward_work(op);
      ASSERT_NE(work, BackwardWork::kNone) << op.id;
      if (work == BackwardWork::kInputGradient) {
        for (const int64_t pred : dags.backward.predecessors(i)) {
          EXPECT_NE(backward_work(dags.backward.op(pred)), BackwardWork::kWeightGradient)
              << op.id << " waits for " << dags.backward.op(pred).id;
        }
        continue;
      }
      weight_work += 1;
      EXPECT_TRUE(op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm) << op.id;
      EXPECT_NE(op.id.find("_wgrad"), std::string::npos) << op.id;
    }
    EXPECT_EQ(weight_work, weighted_forward);
  }
}

TEST(LayerDags, EveryRankIssuesTheSameOpsInTheSameOrder) {
  // Ranks of one communicator must issue the same collectives in the same order; every rank
  // builds the same DAG, with groups only as far apart as placement makes them.
  const JobSpec job = make_job(llama3_70b(), {.tp = 8, .cp = 2, .dp = 2, .sp = true, .seq = 8192});
  const LayerDags reference = build_layer_dags(job, 0);
  for (int64_t rank = 1; rank < job.parallel.world_size(); ++rank) {
    SCOPED_TRACE(rank);
    const LayerDags dags = build_layer_dags(job, rank);
    EXPECT_EQ(topological_ids(dags.forward), topological_ids(reference.forward));
    EXPECT_EQ(topological_ids(dags.backward), topological_ids(reference.backward));
    for (int64_t i = 0; i < dags.backward.size(); ++i) {
      EXPECT_EQ(dags.backward.op(i).signature(), reference.backward.op(i).signature());
    }
  }
}

// ---------------------------------------------------------------- dense shapes and edges

TEST(LayerDags, DenseTpSpForwardIsThePapersFourteenOpChain) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.tp = 8, .sp = true}), 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(
      topological_ids(f),
      (Ids{"fwd.ln_attn", "fwd.allgather_attn", "fwd.gemm_qkv", "fwd.flash_attn", "fwd.gemm_proj",
           "fwd.reduce_scatter_attn", "fwd.bda_attn", "fwd.ln_mlp", "fwd.allgather_mlp",
           "fwd.gemm_fc1", "fwd.swiglu", "fwd.gemm_fc2", "fwd.reduce_scatter_mlp", "fwd.bda_mlp"}));
  // 13 chain edges plus the two residual edges.
  EXPECT_EQ(boost::num_edges(f.graph()), 15u);
  EXPECT_EQ(predecessors(f, "fwd.bda_attn"), (Ids{"fwd.ln_attn", "fwd.reduce_scatter_attn"}));
  EXPECT_EQ(predecessors(f, "fwd.bda_mlp"), (Ids{"fwd.ln_mlp", "fwd.reduce_scatter_mlp"}));
  const Op& ag = op_of(f, "fwd.allgather_attn");
  EXPECT_EQ(ag.kind, OpKind::kAllGather);
  EXPECT_EQ(ag.comm_bytes, 4096 * 8192 * 2);  // T rows × h, bf16
  EXPECT_EQ(ag.group, ParallelDim::kTp);
  EXPECT_EQ(ag.group_size, 8);
  EXPECT_EQ(ag.stream, StreamClass::kLocalComm);
  EXPECT_EQ(op_of(f, "fwd.ln_attn").shape.m, 512);  // T/tp rows with SP
  const Op& qkv = op_of(f, "fwd.gemm_qkv");
  EXPECT_EQ(qkv.shape.m, 4096);
  EXPECT_EQ(qkv.shape.n, 1280);  // (64 + 2·8)·128 / 8
  EXPECT_EQ(qkv.shape.k, 8192);
  const Op& fc1 = op_of(f, "fwd.gemm_fc1");
  EXPECT_EQ(fc1.shape.n, 7168);  // gate and up: 2·28672/8
  const Op& act = op_of(f, "fwd.swiglu");
  EXPECT_EQ(act.shape.m, 4096);
  EXPECT_EQ(act.shape.n, 3584);
  const Op& attn = op_of(f, "fwd.flash_attn");
  EXPECT_EQ(attn.shape.heads, 8);
  EXPECT_EQ(attn.shape.kv_heads, 1);
  EXPECT_EQ(attn.shape.q_len, 4096);
  EXPECT_EQ(attn.shape.kv_len, 4096);
  EXPECT_TRUE(attn.shape.causal);
}

TEST(LayerDags, DenseTpSpBackwardIsThePapersEighteenOps) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.tp = 8, .sp = true}), 0);
  const LayerDag& b = dags.backward;
  EXPECT_EQ(
      topological_ids(b),
      (Ids{"bwd.bda_mlp", "bwd.allgather_mlp", "bwd.fc2_dgrad", "bwd.fc2_wgrad", "bwd.swiglu",
           "bwd.fc1_dgrad", "bwd.fc1_wgrad", "bwd.reduce_scatter_mlp", "bwd.ln_mlp", "bwd.bda_attn",
           "bwd.allgather_attn", "bwd.proj_dgrad", "bwd.proj_wgrad", "bwd.flash_attn",
           "bwd.qkv_dgrad", "bwd.qkv_wgrad", "bwd.reduce_scatter_attn", "bwd.ln_attn"}));
  EXPECT_EQ(predecessors(b, "bwd.fc2_wgrad"), Ids{"bwd.allgather_mlp"});
  EXPECT_EQ(predecessors(b, "bwd.fc1_wgrad"), Ids{"bwd.swiglu"});
  EXPECT_EQ(predecessors(b, "bwd.qkv_wgrad"), Ids{"bwd.flash_attn"});
  EXPECT_EQ(predecessors(b, "bwd.bda_attn"), (Ids{"bwd.bda_mlp", "bwd.ln_mlp"}));
  EXPECT_EQ(predecessors(b, "bwd.ln_attn"), (Ids{"bwd.bda_attn", "bwd.reduce_scatter_attn"}));
  const Op& wgrad = op_of(b, "bwd.fc1_wgrad");
  EXPECT_EQ(wgrad.kind, OpKind::kGemm);
  EXPECT_EQ(wgrad.gemm_role, GemmRole::kWgrad);
  EXPECT_EQ(wgrad.shape.m, 7168);  // dW is (2·f/tp) × h, tokens reduced
  EXPECT_EQ(wgrad.shape.n, 8192);
  EXPECT_EQ(wgrad.shape.k, 4096);
  EXPECT_EQ(op_of(b, "bwd.flash_attn").flops, 2 * op_of(dags.forward, "fwd.flash_attn").flops);
}

TEST(LayerDags, TensorParallelWithoutSpAllReducesAfterRowParallelGemmsAndColumnDgrads) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.tp = 8}), 0);
  EXPECT_EQ(topological_ids(dags.forward),
            (Ids{"fwd.ln_attn", "fwd.gemm_qkv", "fwd.flash_attn", "fwd.gemm_proj",
                 "fwd.allreduce_attn", "fwd.bda_attn", "fwd.ln_mlp", "fwd.gemm_fc1", "fwd.swiglu",
                 "fwd.gemm_fc2", "fwd.allreduce_mlp", "fwd.bda_mlp"}));
  EXPECT_EQ(predecessors(dags.backward, "bwd.allreduce_mlp"), Ids{"bwd.fc1_dgrad"});
  EXPECT_EQ(predecessors(dags.backward, "bwd.allreduce_attn"), Ids{"bwd.qkv_dgrad"});
  EXPECT_EQ(op_of(dags.forward, "fwd.ln_attn").shape.m, 4096);  // all T rows
  EXPECT_EQ(op_of(dags.forward, "fwd.allreduce_attn").comm_bytes, 4096 * 8192 * 2);
  EXPECT_EQ(op_of(dags.forward, "fwd.allreduce_attn").kind, OpKind::kAllReduce);
}

TEST(LayerDags, TensorParallelOneHasNoCommunication) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.dp = 8}), 0);
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) EXPECT_FALSE(is_communication(dag->op(i).kind));
  }
  EXPECT_EQ(op_of(dags.forward, "fwd.gemm_qkv").shape.n, 10240);
}

TEST(LayerDags, GptStyleUsesLayerNormGeluAndBias) {
  const LayerDags dags = build_layer_dags(make_job(gpt_style(), {.tp = 4, .dp = 2, .sp = true}), 0);
  EXPECT_EQ(op_of(dags.forward, "fwd.ln_attn").variant, "layernorm");
  EXPECT_EQ(op_of(dags.forward, "fwd.gelu").variant, "gelu");
  EXPECT_EQ(op_of(dags.forward, "fwd.bda_mlp").variant, "bias");
  EXPECT_EQ(op_of(dags.forward, "fwd.gemm_fc1").shape.n, 6144);  // 24576/4, no gate
}

// ---------------------------------------------------------------- context parallelism

TEST(LayerDags, ContextParallelRingOverlapsEachExchangeWithTheStepBefore) {
  // cp ranks of rank 0 are {0, 8}: the ring crosses nodes.
  const LayerDags dags =
      build_layer_dags(make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768}), 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(topological_ids(f), (Ids{"fwd.ln_attn",
                                     "fwd.allgather_attn",
                                     "fwd.gemm_qkv",
                                     "fwd.kv_sendrecv0",
                                     "fwd.attn_step0",
                                     "fwd.kv_sendrecv1",
                                     "fwd.attn_step1",
                                     "fwd.kv_sendrecv2",
                                     "fwd.attn_step2",
                                     "fwd.attn_step3",
                                     "fwd.attn_merge",
                                     "fwd.gemm_proj",
                                     "fwd.reduce_scatter_attn",
                                     "fwd.bda_attn",
                                     "fwd.ln_mlp",
                                     "fwd.allgather_mlp",
                                     "fwd.gemm_fc1",
                                     "fwd.swiglu",
                                     "fwd.gemm_fc2",
                                     "fwd.reduce_scatter_mlp",
                                     "fwd.bda_mlp"}));
  EXPECT_EQ(predecessors(f, "fwd.kv_sendrecv0"), Ids{"fwd.gemm_qkv"});
  EXPECT_EQ(predecessors(f, "fwd.kv_sendrecv1"), Ids{"fwd.kv_sendrecv0"});
  EXPECT_EQ(predecessors(f, "fwd.attn_step0"), Ids{"fwd.gemm_qkv"});
  EXPECT_EQ(predecessors(f, "fwd.attn_step2"), (Ids{"fwd.kv_sendrecv1", "fwd.attn_step1"}));
  EXPECT_EQ(predecessors(f, "fwd.attn_merge"),
            (Ids{"fwd.attn_step0", "fwd.attn_step1", "fwd.attn_step2", "fwd.attn_step3"}));
  for (int i = 0; i < 3; ++i) {
    for (int j = i; j < 3; ++j) {
      EXPECT_FALSE(
          reaches(f, "fwd.attn_step" + std::to_string(i), "fwd.kv_sendrecv" + std::to_string(j)));
    }
  }
  // T = 32768/4 = 8192 tokens; K and V of one KV head per rank: 2·8192·128·2 bytes.
  const Op& hop = op_of(f, "fwd.kv_sendrecv0");
  EXPECT_EQ(hop.kind, OpKind::kSendRecv);
  EXPECT_EQ(hop.comm_bytes, 4194304);
  EXPECT_EQ(hop.group, ParallelDim::kCp);
  EXPECT_EQ(hop.group_size, 4);
  EXPECT_EQ(hop.scope, GroupScope::kCrossNode);
  EXPECT_EQ(hop.nodes_spanned, 4);
  EXPECT_EQ(hop.stream, StreamClass::kCrossComm);
  const Op& step = op_of(f, "fwd.attn_step1");
  EXPECT_EQ(step.shape.q_len, 8192);
  EXPECT_EQ(step.shape.kv_len, 8192);
  EXPECT_EQ(op_of(f, "fwd.attn_merge").shape.batch, 4);

  const LayerDag& b = dags.backward;
  const int64_t bytes[] = {4194304, 8388608, 8388608, 4194304, 4194304};
  for (int i = 0; i <= 4; ++i) {
    const std::string id = "bwd.kv_sendrecv" + std::to_string(i);
    EXPECT_EQ(op_of(b, id).comm_bytes, bytes[i]) << id;
    if (i < 4) {
      EXPECT_FALSE(reaches(b, "bwd.attn_step" + std::to_string(i), id)) << id;
    }
  }
  EXPECT_EQ(predecessors(b, "bwd.kv_sendrecv0"), Ids{"bwd.proj_dgrad"});
  EXPECT_EQ(predecessors(b, "bwd.kv_sendrecv2"), (Ids{"bwd.kv_sendrecv1", "bwd.attn_step1"}));
  EXPECT_EQ(predecessors(b, "bwd.attn_step2"), (Ids{"bwd.kv_sendrecv1", "bwd.attn_step1"}));
  EXPECT_EQ(predecessors(b, "bwd.kv_sendrecv4"), (Ids{"bwd.kv_sendrecv3", "bwd.attn_step3"}));
  EXPECT_EQ(predecessors(b, "bwd.qkv_dgrad"), (Ids{"bwd.attn_step3", "bwd.kv_sendrecv4"}));
}

TEST(LayerDags, ContextParallelRingOfMegatronZeroFiveCarriesTheQueryHeads) {
  // Llama-3-70B, tp 8, cp 4, 32k: T = 8192; 64 query heads / 8 = 8 a rank against 1 KV head.
  // "query": 2 * 8192 * 8 * 128 * 2 bytes = 32 MiB a hop, 8x the grouped ring's 4 MiB.
  JobSpec job = make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768});
  job.parallel.cp_ring_query_heads = true;
  const LayerDags dags = build_layer_dags(job, 0);
  EXPECT_EQ(op_of(dags.forward, "fwd.kv_sendrecv0").comm_bytes, 33554432);
  EXPECT_EQ(op_of(dags.backward, "bwd.kv_sendrecv1").comm_bytes, 2 * 33554432);
  // The attention steps are the same kernels either way.
  EXPECT_EQ(op_of(dags.forward, "fwd.attn_step1").shape.kv_len, 8192);
}

TEST(LayerDags, ContextParallelTwoMatchesThePrototypesRing) {
  const LayerDags dags =
      build_layer_dags(make_job(llama3_70b(), {.cp = 2, .dp = 4}), 0);  // cp ranks {0, 1}
  Ids attention;
  for (const std::string& id : topological_ids(dags.backward)) {
    if (id.find("attn_step") != std::string::npos || id.find("sendrecv") != std::string::npos) {
      attention.push_back(id);
    }
  }
  EXPECT_EQ(attention, (Ids{"bwd.kv_sendrecv0", "bwd.attn_step0", "bwd.kv_sendrecv1",
                            "bwd.attn_step1", "bwd.kv_sendrecv2"}));
  const Op& hop = op_of(dags.forward, "fwd.kv_sendrecv0");
  EXPECT_EQ(hop.comm_bytes, 2 * 2048 * 8 * 128 * 2);  // all 8 KV heads at tp = 1
  EXPECT_EQ(hop.scope, GroupScope::kLocal);
  EXPECT_EQ(hop.stream, StreamClass::kLocalComm);
}

// ---------------------------------------------------------------- mixture of experts

// The job with perfectly balanced routing (imbalance 1), the shapes the tests below count.
JobSpec balanced(JobSpec job) {
  job.parallel.moe_load_imbalance = 1.0;
  return job;
}

TEST(LayerDags, MoeReplacesTheMlpWithRoutedExperts) {
  const LayerDags dags = build_layer_dags(balanced(make_job(phi35_moe(), {.dp = 8, .ep = 8})), 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(
      topological_ids(f),
      (Ids{"fwd.ln_attn", "fwd.gemm_qkv", "fwd.flash_attn", "fwd.gemm_proj", "fwd.bda_attn",
           "fwd.ln_mlp", "fwd.router", "fwd.permute", "fwd.dispatch_a2a", "fwd.grouped_fc1",
           "fwd.swiglu", "fwd.grouped_fc2", "fwd.combine_a2a", "fwd.unpermute", "fwd.bda_mlp"}));
  EXPECT_EQ(successors(f, "fwd.router"), Ids{"fwd.permute"});
  // N = 4096 tokens, top-2 of 16 experts, 2 local experts: each sees 4096·2·8/16 tokens.
  const Op& fc1 = op_of(f, "fwd.grouped_fc1");
  EXPECT_EQ(fc1.kind, OpKind::kGroupedGemm);
  EXPECT_EQ(fc1.shape.batch, 2);
  EXPECT_EQ(fc1.shape.m, 4096);
  EXPECT_EQ(fc1.shape.n, 12800);
  EXPECT_EQ(fc1.shape.k, 4096);
  const Op& a2a = op_of(f, "fwd.dispatch_a2a");
  EXPECT_EQ(a2a.comm_bytes, 8192LL * 4096 * 2);  // N·k token copies × h, bf16
  EXPECT_EQ(a2a.group, ParallelDim::kEp);
  EXPECT_EQ(a2a.group_size, 8);
  EXPECT_EQ(a2a.scope, GroupScope::kLocal);
  const Op& router = op_of(f, "fwd.router");
  EXPECT_EQ(router.shape.m, 4096);
  EXPECT_EQ(router.shape.n, 16);
  EXPECT_EQ(router.shape.k, 4096);

  const LayerDag& b = dags.backward;
  EXPECT_EQ(predecessors(b, "bwd.router"), Ids{"bwd.unpermute"});
  EXPECT_EQ(predecessors(b, "bwd.ln_mlp"), (Ids{"bwd.permute", "bwd.router"}));
  EXPECT_FALSE(reaches(b, "bwd.router", "bwd.permute"));
  EXPECT_EQ(predecessors(b, "bwd.combine_a2a"), Ids{"bwd.unpermute"});
  EXPECT_EQ(predecessors(b, "bwd.dispatch_a2a"), Ids{"bwd.grouped_fc1_dgrad"});
  EXPECT_EQ(predecessors(b, "bwd.router_wgrad"), Ids{"bwd.router"});
}

TEST(LayerDags, MoeWithSequenceParallelismWorksOnItsTokenShardAcrossNodes) {
  // tp 2 · dp 8 on 8-GPU nodes: the EP group of rank 0 is {0, 2, ..., 14}, two nodes.
  JobSpec job = balanced(make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8, .sp = true}));
  job.parallel.expert_tp = 1;  // whole experts on each TP rank
  const LayerDags dags = build_layer_dags(job, 0);
  const Op& a2a = op_of(dags.forward, "fwd.combine_a2a");
  EXPECT_EQ(a2a.comm_bytes, 4096LL * 4096 * 2);  // N = 2048 tokens, top-2
  EXPECT_EQ(a2a.scope, GroupScope::kCrossNode);
  EXPECT_EQ(a2a.nodes_spanned, 2);
  EXPECT_EQ(a2a.stream, StreamClass::kCrossComm);
  EXPECT_EQ(op_of(dags.forward, "fwd.grouped_fc2").shape.m, 2048);
  EXPECT_EQ(op_of(dags.forward, "fwd.router").shape.m, 2048);
  EXPECT_FALSE(dags.forward.find("fwd.allgather_mlp").has_value());
  EXPECT_FALSE(dags.backward.find("bwd.reduce_scatter_mlp").has_value());
}

TEST(LayerDags, MoeCapacityFactorOnlyLimitsExpertInputs) {
  // N = 4096 tokens, top-2, 16 experts, ep 8: balanced share N·k/E = 512 per (rank, expert).
  ModelSpec model = phi35_moe();
  model.moe->capacity_factor = 1.25;  // cap 640 >= 512: nothing dropped, nothing padded
  const LayerDags roomy = build_layer_dags(balanced(make_job(model, {.dp = 8, .ep = 8})), 0);
  EXPECT_EQ(op_of(roomy.forward, "fwd.grouped_fc1").shape.m, 8 * 512);
  EXPECT_EQ(op_of(roomy.forward, "fwd.dispatch_a2a").comm_bytes, 8192LL * 4096 * 2);
  EXPECT_EQ(op_of(roomy.forward, "fwd.permute").shape.m, 8192);
  model.moe->capacity_factor = 0.5;  // cap = ceil(0.5·4096·2/16) = 256: half is dropped
  const LayerDags tight = build_layer_dags(balanced(make_job(model, {.dp = 8, .ep = 8})), 0);
  EXPECT_EQ(op_of(tight.forward, "fwd.grouped_fc1").shape.m, 8 * 256);
  EXPECT_EQ(op_of(tight.forward, "fwd.dispatch_a2a").comm_bytes, 16LL * 256 * 4096 * 2);
  EXPECT_EQ(op_of(tight.forward, "fwd.permute").shape.m, 16 * 256);
}

TEST(LayerDags, ExpertTensorParallelismSplitsExpertsOverTheTpGroup) {
  // tp 2 (default expert_tp = tp), dp 8, ep 8, balanced: N = 2048 tokens a rank, mean share
  // 2048 * 2 / 16 = 256, m = 8 * 256 = 2048 rows received, 4096 after the TP all-gather;
  // each expert keeps 6400 / 2 = 3200 FFN columns (SwiGLU fc1: 6400 fused).
  const LayerDags dags =
      build_layer_dags(balanced(make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8, .sp = true})), 0);
  const LayerDag& f = dags.forward;
  const Op& fc1 = op_of(f, "fwd.grouped_fc1");
  EXPECT_EQ(fc1.shape.m, 4096);
  EXPECT_EQ(fc1.shape.n, 6400);
  EXPECT_EQ(op_of(f, "fwd.grouped_fc2").shape.k, 3200);
  EXPECT_EQ(predecessors(f, "fwd.etp_allgather"), Ids{"fwd.dispatch_a2a"});
  EXPECT_EQ(predecessors(f, "fwd.grouped_fc1"), Ids{"fwd.etp_allgather"});
  EXPECT_EQ(predecessors(f, "fwd.combine_a2a"), Ids{"fwd.etp_reduce_scatter"});
  // Gathered buffer: etp * P rows = 2 * 4096 rows of h = 4096, bf16.
  const Op& gather = op_of(f, "fwd.etp_allgather");
  EXPECT_EQ(gather.group, ParallelDim::kTp);
  EXPECT_EQ(gather.comm_bytes, 2LL * 4096 * 4096 * 2);
  const LayerDag& b = dags.backward;
  EXPECT_EQ(predecessors(b, "bwd.etp_allgather"), Ids{"bwd.combine_a2a"});
  EXPECT_EQ(predecessors(b, "bwd.dispatch_a2a"), Ids{"bwd.etp_reduce_scatter"});
  EXPECT_EQ(op_of(b, "bwd.grouped_fc1_wgrad").shape.k, 4096);
}

TEST(LayerDags, MoeLoadImbalanceScalesExpertGemmsAndAllToAlls) {
  // N = 4096, top-2, 16 experts, ep 8: mean share 512 a (rank, expert), P = 8192 copies.
  // Default f = 1.72 (no capacity factor): busiest share ceil(1.72 * 512) = ceil(880.64) =
  // 881, m = 8 * 881 = 7048; the all-to-alls move ceil(1.72 * 8192) = ceil(14090.24) = 14091
  // rows of h = 4096 bf16. The permutations keep the rank's own 8192 copies.
  ModelSpec model = phi35_moe();
  model.moe->capacity_factor = 0;
  const LayerDags skewed = build_layer_dags(make_job(model, {.dp = 8, .ep = 8}), 0);
  EXPECT_EQ(op_of(skewed.forward, "fwd.grouped_fc1").shape.m, 7048);
  EXPECT_EQ(op_of(skewed.backward, "bwd.grouped_fc2_wgrad").shape.k, 7048);
  EXPECT_EQ(op_of(skewed.forward, "fwd.dispatch_a2a").comm_bytes, 14091LL * 4096 * 2);
  EXPECT_EQ(op_of(skewed.backward, "bwd.combine_a2a").comm_bytes, 14091LL * 4096 * 2);
  EXPECT_EQ(op_of(skewed.forward, "fwd.permute").shape.m, 8192);
  // Capacity factor 1.25 caps f at 1.25: busiest share 640, m = 5120; 10240 rows moved.
  model.moe->capacity_factor = 1.25;
  const LayerDags capped = build_layer_dags(make_job(model, {.dp = 8, .ep = 8}), 0);
  EXPECT_EQ(op_of(capped.forward, "fwd.grouped_fc1").shape.m, 5120);
  EXPECT_EQ(op_of(capped.forward, "fwd.dispatch_a2a").comm_bytes, 10240LL * 4096 * 2);
  // The job's own figure: 1.5 -> share 768, m = 6144; 12288 rows.
  JobSpec job = make_job(model, {.dp = 8, .ep = 8});
  job.parallel.moe_load_imbalance = 1.5;
  model.moe->capacity_factor = 0;
  job.model = model;
  const LayerDags own = build_layer_dags(job, 0);
  EXPECT_EQ(op_of(own.forward, "fwd.grouped_fc1").shape.m, 6144);
  EXPECT_EQ(op_of(own.forward, "fwd.combine_a2a").comm_bytes, 12288LL * 4096 * 2);
}

TEST(LayerDags, MoeWithTensorParallelismNeedsSequenceParallelism) {
  try {
    build_layer_dags(make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8}), 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_STREQ(e.what(),
                 "job.json: /parallel/sp: false is not supported for a mixture-of-experts model "
                 "with tp = 2 (MoE layers with tensor parallelism need sequence parallelism, as "
                 "in Megatron-LM)");
  }
}

// ---------------------------------------------------------------- stage extras

TEST(StageExtras, PresentForFirstAndLastStageOnly) {
  const JobSpec job = make_job(llama3_70b(), {.tp = 8, .pp = 4, .sp = true});
  const LayerDags none = build_stage_extras(job, 8, false, false);
  EXPECT_EQ(none.forward.size(), 0);
  EXPECT_EQ(none.backward.size(), 0);

  const LayerDags first = build_stage_extras(job, 0, true, false);
  EXPECT_EQ(topological_ids(first.forward), (Ids{"fwd.embedding", "fwd.reduce_scatter_embedding"}));
  EXPECT_EQ(topological_ids(first.backward), (Ids{"bwd.allgather_embedding", "bwd.embedding"}));
  EXPECT_TRUE(op_of(first.backward, "bwd.embedding").movable_sink);

  const LayerDags last = build_stage_extras(job, 24, false, true);
  EXPECT_EQ(topological_ids(last.forward), (Ids{"fwd.final_norm", "fwd.allgather_head", "fwd.head",
                                                "fwd.allreduce_loss", "fwd.loss"}));
  EXPECT_EQ(topological_ids(last.backward), (Ids{"bwd.loss", "bwd.head_dgrad", "bwd.head_wgrad",
                                                 "bwd.reduce_scatter_head", "bwd.final_norm"}));
  const Op& head = op_of(last.forward, "fwd.head");
  EXPECT_EQ(head.kind, OpKind::kHead);
  EXPECT_EQ(head.shape.n, 16032);  // 128256 / 8
  const Op& loss_stats = op_of(last.forward, "fwd.allreduce_loss");
  EXPECT_EQ(loss_stats.dtype, DType::kFp32);
  EXPECT_EQ(loss_stats.comm_bytes, 3 * 4096 * 4);
  EXPECT_TRUE(op_of(last.backward, "bwd.head_wgrad").movable_sink);

  const LayerDags folded = build_stage_extras(job, 0, true, true);
  EXPECT_EQ(folded.forward.size(), 7);
  EXPECT_EQ(folded.backward.size(), 7);
  EXPECT_TRUE(folded.forward.is_acyclic());
}

TEST(StageExtras, WithoutSpAllReducesAndWithTpOneCommunicatesNothing) {
  const LayerDags no_sp = build_stage_extras(make_job(llama3_70b(), {.tp = 8}), 0, true, true);
  EXPECT_EQ(topological_ids(no_sp.forward),
            (Ids{"fwd.embedding", "fwd.allreduce_embedding", "fwd.final_norm", "fwd.head",
                 "fwd.allreduce_loss", "fwd.loss"}));
  EXPECT_EQ(topological_ids(no_sp.backward),
            (Ids{"bwd.embedding", "bwd.loss", "bwd.head_dgrad", "bwd.head_wgrad",
                 "bwd.allreduce_head", "bwd.final_norm"}));
  const LayerDags tp1 = build_stage_extras(make_job(llama3_70b(), {.dp = 8}), 0, true, true);
  EXPECT_EQ(topological_ids(tp1.forward),
            (Ids{"fwd.embedding", "fwd.final_norm", "fwd.head", "fwd.loss"}));
}

// ---------------------------------------------------------------- exports

TEST(DagExport, DotHasClustersStreamColoursAndDashedSinks) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.tp = 8, .sp = true}), 0);
  const std::string dot = dag_to_dot(dags, "llama \"70b\"");
  EXPECT_EQ(dot.rfind("digraph \"llama \\\"70b\\\"\" {\n", 0), 0u);
  EXPECT_NE(dot.find("subgraph cluster_forward {"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_backward {"), std::string::npos);
  EXPECT_NE(dot.find("f1 [label=\"1 fwd.allgather_attn\\nall_gather\\n64.0 MiB tp8 local\", "
                     "fillcolor=\"#f9cb9c\", style=\"rounded,filled\"];"),
            std::string::npos);
  EXPECT_NE(dot.find("f2 [label=\"2 fwd.gemm_qkv\\ngemm\\nm 4096 n 1280 k 8192\", "
                     "fillcolor=\"#cfe2f3\", style=\"rounded,filled\"];"),
            std::string::npos);
  EXPECT_NE(dot.find("    f0 -> f6;\n"), std::string::npos);  // residual edge
  size_t dashed = 0;
  for (size_t at = dot.find("dashed"); at != std::string::npos; at = dot.find("dashed", at + 1)) {
    ++dashed;
  }
  EXPECT_EQ(dashed, 4u);
  EXPECT_EQ(dot, dag_to_dot(dags, "llama \"70b\""));
}

TEST(DagExport, JsonListsOpsEdgesAndOrder) {
  const LayerDags dags = build_layer_dags(make_job(llama3_70b(), {.tp = 8, .sp = true}), 0);
  const OrderedJson j = dag_to_json(dags);
  ASSERT_EQ(j["forward"]["ops"].size(), 14u);
  ASSERT_EQ(j["backward"]["ops"].size(), 18u);
  EXPECT_EQ(j["forward"]["edges"].size(), 15u);
  EXPECT_EQ(j["forward"]["edges"][0].dump(), R"({"from":"fwd.ln_attn","to":"fwd.allgather_attn"})");
  EXPECT_EQ(j["backward"]["topological_order"][3], "bwd.fc2_wgrad");
  const OrderedJson& ag = j["forward"]["ops"][1];
  EXPECT_EQ(ag.dump(),
            R"({"id":"fwd.allgather_attn","kind":"all_gather","pass":"fwd","gemm_role":"none",)"
            R"("variant":"","dtype":"bf16","shape":{"m":0,"n":0,"k":0,"batch":1,"heads":0,)"
            R"("kv_heads":0,"q_len":0,"kv_len":0,"head_dim":0,"causal":false},"flops":0.0,)"
            R"("bytes_read":0,"bytes_written":0,"comm_bytes":67108864,"group":"tp",)"
            R"("group_size":8,"scope":"local","nodes_spanned":1,"stream":"local_comm",)"
            R"("movable_sink":false,"signature":"all_gather:bf16:bytes=67108864:tp8:local"})");
  EXPECT_EQ(j["backward"]["ops"][6]["movable_sink"], true);
  EXPECT_EQ(j.dump(), dag_to_json(dags).dump());
}

}  // namespace
}  // namespace dhelix
