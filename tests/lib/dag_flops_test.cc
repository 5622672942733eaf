// The DAG builder's work accounting against Megatron-LM's closed-form FLOPs
// (training_flops_per_iteration): one layer's forward + backward, summed over the tp·cp
// ranks that share a micro-batch's layer, is the formula's per-layer part.

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;
using testing::phi35_moe;

// The per-layer part of Megatron's formula: 12·B·s·h²·[(1 + G/H + s/h)·(q/h) + (f/h)·k·(3/2)].
double formula_per_layer(const JobSpec& job) {
  ModelSpec no_vocab = job.model;
  no_vocab.vocab_size = 0;  // drops the logits term
  return training_flops_per_iteration(no_vocab, job.parallel.micro_batch_size,
                                      job.parallel.seq_length) /
         static_cast<double>(job.model.num_layers);
}

struct Sums {
  double all = 0;
  double matmul = 0;  // GEMMs and attention of the model's layers (no router)
};

Sums layer_flops_over_sharing_ranks(const JobSpec& job) {
  const LayerDags dags = build_layer_dags(job, 0);
  Sums sums;
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) {
      const Op& op = dag->op(i);
      sums.all += op.flops;
      const bool matmul = op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm ||
                          op.kind == OpKind::kAttention;
      // Megatron's formula leaves the router out; its weight gradient is a plain GEMM here.
      if (matmul && op.id != "bwd.router_wgrad") sums.matmul += op.flops;
    }
  }
  // Every rank of the tp·cp block does the same work on its share of the micro-batch.
  const auto sharing = static_cast<double>(job.parallel.tp * job.parallel.cp);
  sums.all *= sharing;
  sums.matmul *= sharing;
  return sums;
}

void expect_matches_formula(const JobSpec& job) {
  const double formula = formula_per_layer(job);
  const Sums sums = layer_flops_over_sharing_ranks(job);
  // GEMMs and attention are the formula, term by term.
  EXPECT_NEAR(sums.matmul / formula, 1.0, 1e-12);
  // Norms, activations, routers and the rest add a little, never 1 %.
  EXPECT_GT(sums.all, formula);
  EXPECT_LT(sums.all / formula, 1.01);
}

TEST(DagFlops, DenseTensorAndSequenceParallelMatchesMegatron) {
  expect_matches_formula(make_job(llama3_70b(), {.tp = 8, .sp = true, .seq = 4096}));
  expect_matches_formula(make_job(llama3_70b(), {.tp = 4, .seq = 2048, .micro_batch = 2}));
}

TEST(DagFlops, ContextParallelRingMatchesMegatron) {
  expect_matches_formula(make_job(llama3_70b(), {.tp = 8, .cp = 2, .sp = true, .seq = 16384}));
  expect_matches_formula(make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768}));
}

TEST(DagFlops, MixtureOfExpertsMatchesMegatron) {
  // Dropless and balanced: each rank computes exactly N·top_k token-expert products (with
  // expert tensor parallelism etp times the tokens on 1/etp of each expert's columns).
  const auto balanced = [](JobSpec job) {
    job.parallel.moe_load_imbalance = 1.0;
    return job;
  };
  expect_matches_formula(balanced(make_job(phi35_moe(), {.dp = 8, .ep = 8})));
  expect_matches_formula(balanced(make_job(phi35_moe(), {.tp = 2, .dp = 8, .ep = 8, .sp = true})));
}

TEST(DagFlops, HandComputedOps) {
  const LayerDags dags =
      build_layer_dags(make_job(llama3_70b(), {.tp = 8, .sp = true, .seq = 8192}), 0);
  const auto op = [&](const LayerDag& dag, const std::string& id) -> const Op& {
    return dag.op(dag.find(id).value());
  };
  const Op& qkv = op(dags.forward, "fwd.gemm_qkv");
  EXPECT_EQ(qkv.flops, 171798691840.0);  // 2·8192·1280·8192
  EXPECT_EQ(qkv.bytes_read, (8192LL * 8192 + 8192LL * 1280) * 2);
  EXPECT_EQ(qkv.bytes_written, 8192LL * 1280 * 2);
  EXPECT_EQ(op(dags.forward, "fwd.flash_attn").flops, 274877906944.0);  // 4·8·8192²·128
  EXPECT_EQ(op(dags.backward, "bwd.flash_attn").flops, 549755813888.0);
  EXPECT_EQ(op(dags.backward, "bwd.fc1_wgrad").flops, op(dags.forward, "fwd.gemm_fc1").flops);
  EXPECT_EQ(op(dags.backward, "bwd.fc1_dgrad").flops, op(dags.forward, "fwd.gemm_fc1").flops);
  const Op& ln = op(dags.forward, "fwd.ln_attn");
  EXPECT_EQ(ln.flops, 4.0 * 1024 * 8192);
  EXPECT_EQ(ln.bytes_read, 1024LL * 8192 * 2);
  EXPECT_EQ(ln.bytes_written, 1024LL * 8192 * 2);
  EXPECT_EQ(op(dags.backward, "bwd.ln_attn").flops, 8.0 * 1024 * 8192);
  EXPECT_EQ(op(dags.forward, "fwd.reduce_scatter_attn").flops, 0.0);
}

TEST(DagFlops, HeadAndLossMatchTheFormulasLogitsTerm) {
  const JobSpec job = make_job(llama3_70b(), {.tp = 8, .sp = true, .seq = 4096});
  const LayerDags extras = build_stage_extras(job, 0, false, true);
  double head = 0;
  for (const LayerDag* dag : {&extras.forward, &extras.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) {
      if (dag->op(i).kind == OpKind::kHead) head += dag->op(i).flops;
    }
  }
  // The logits term of the formula: 12·B·s·L·h²·V/(2·L·h) = 6·B·s·h·V.
  EXPECT_EQ(head * 8, 6.0 * 4096 * 8192 * 128256);
}

}  // namespace
}  // namespace dhelix
