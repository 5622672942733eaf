// Activation recompute: bytes kept per chunk against Korthikanti et al. 2022 ("Reducing
// Activation Recomputation in Large Transformer Models", Table 2), the recomputed ops in
// the backward DAG, and the simulator's accounting of both.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "planner/memory_model.h"
#include "planner/pipeline_simulator.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

// GPT-3 style layer (the Korthikanti test of memory_model_test.cc): s = 2048, b = 1,
// h = 1024, t = 4, SP on, dropout on. Without recompute a layer keeps 34·s·b·h/t bytes.
ModelSpec gpt() {
  ModelSpec m;
  m.norm = NormKind::kLayerNorm;
  m.activation = ActivationKind::kGelu;
  m.hidden_size = 1024;
  m.ffn_hidden_size = 4096;
  m.num_layers = 24;
  m.num_attention_heads = 16;
  m.num_kv_heads = 16;
  m.head_dim = 64;
  m.vocab_size = 50257;
  return m;
}

ParallelSpec tp4_sp() {
  ParallelSpec p;
  p.tp = 4;
  p.sp = true;
  p.seq_length = 2048;
  p.micro_batch_size = 1;
  return p;
}

MemoryOptions with_dropout() {
  MemoryOptions o;
  o.dropout = true;
  return o;
}

constexpr int64_t kSbh = int64_t{2048} * 1024;  // s·b·h

TEST(Recompute, NoneKeepsEveryLayer) {
  const ParallelSpec p = tp4_sp();
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()), 6 * 34 * kSbh / 4);
  EXPECT_EQ(recompute_transient_bytes(gpt(), p, 6, with_dropout()), 0);
}

// Korthikanti's "full activation recompute": 2·s·b·h per layer (the layer input, bf16);
// Megatron checkpoints the sequence-parallel shard, so /t with SP.
TEST(Recompute, FullUniformKeepsOneInputPerGroup) {
  ParallelSpec p = tp4_sp();
  p.recompute.granularity = RecomputeGranularity::kFull;
  EXPECT_EQ(layer_input_bytes(gpt(), p), 2 * kSbh / 4);
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()), 6 * 2 * kSbh / 4);
  // The recomputed layer's 34·s·b·h/t are live while its backward runs, its input (2·s·b·h/t)
  // being the checkpoint already kept.
  EXPECT_EQ(recompute_transient_bytes(gpt(), p, 6, with_dropout()), (34 - 2) * kSbh / 4);
  // Groups of 4: ceil(6/4) = 2 inputs kept; a group of 4 layers recomputed at once.
  p.recompute.num_layers = 4;
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()), 2 * 2 * kSbh / 4);
  EXPECT_EQ(recompute_transient_bytes(gpt(), p, 6, with_dropout()), (4 * 34 - 2) * kSbh / 4);
  // Without SP the input is whole on every rank: 2·s·b·h.
  p.sp = false;
  p.recompute.num_layers = 1;
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 3, with_dropout()), 3 * 2 * kSbh);
}

// Block, 2 of 6 layers: 2 inputs + 4 whole layers; one layer recomputed at a time.
TEST(Recompute, FullBlockMixesKeptAndRecomputedLayers) {
  ParallelSpec p = tp4_sp();
  p.recompute.granularity = RecomputeGranularity::kFull;
  p.recompute.method = RecomputeMethod::kBlock;
  p.recompute.num_layers = 2;
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()),
            2 * 2 * kSbh / 4 + 4 * 34 * kSbh / 4);
  EXPECT_EQ(recompute_transient_bytes(gpt(), p, 6, with_dropout()), (34 - 2) * kSbh / 4);
  // More recomputed layers than the chunk holds: all of them.
  p.recompute.num_layers = 9;
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()), 6 * 2 * kSbh / 4);
}

// Korthikanti's selective recompute keeps s·b·h·34/t (TP + SP, Table 2): the 5·a·s/h
// attention-score term is gone. The flash-attention figure already lacks it.
TEST(Recompute, SelectiveKeepsKorthikantiSelectiveFigure) {
  ParallelSpec p = tp4_sp();
  p.recompute.granularity = RecomputeGranularity::kSelective;
  EXPECT_EQ(chunk_activation_bytes(gpt(), p, 6, with_dropout()), 6 * 34 * kSbh / 4);
  EXPECT_EQ(recompute_transient_bytes(gpt(), p, 6, with_dropout()), 0);
}

// Llama-3.1-405B with tp 8, SP, 8192 tokens (h = 16384, 128 heads over 8 KV heads,
// f = 3.25h): per token 8h (norm and GEMM inputs) + 2·(2h + 2h/16) (Q, K, V, O) +
// 2·3·3.25h (SwiGLU) = 31.75h bytes, /8: 508 MiB per layer. Full recompute keeps the
// 2·s·h/8 = 32 MiB input of each layer instead.
TEST(Recompute, Llama405bLayer) {
  ModelSpec m;
  m.hidden_size = 16384;
  m.ffn_hidden_size = 53248;
  m.num_layers = 126;
  m.num_attention_heads = 128;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 128256;
  ParallelSpec p;
  p.tp = 8;
  p.sp = true;
  p.pp = 16;
  p.seq_length = 8192;
  const int64_t sh = int64_t{8192} * 16384;
  EXPECT_EQ(layer_activation_bytes(m, p), sh * 127 / 4 / 8);  // 31.75 = 127/4
  p.recompute.granularity = RecomputeGranularity::kFull;
  EXPECT_EQ(chunk_activation_bytes(m, p, 8), 8 * 2 * sh / 8);  // 8 x 32 MiB
}

// ----- the backward DAG ---------------------------------------------------------------

int64_t count_prefix(const LayerDag& dag, const std::string& prefix) {
  int64_t n = 0;
  for (int64_t i = 0; i < dag.size(); ++i) n += dag.op(i).id.starts_with(prefix) ? 1 : 0;
  return n;
}

TEST(Recompute, FullRepeatsTheForwardBeforeTheBackward) {
  testing::Shape s;
  s.tp = 8;
  s.sp = true;
  const LayerDags plain = build_layer_dags(testing::make_job(testing::llama3_70b(), s), 0);
  const LayerDags full = with_recompute(plain, RecomputeGranularity::kFull);
  EXPECT_EQ(plain.forward.size(), 14);
  EXPECT_EQ(plain.backward.size(), 18);
  EXPECT_EQ(full.forward.size(), 14);
  ASSERT_EQ(full.backward.size(), 32);
  EXPECT_EQ(count_prefix(full.backward, "bwd.recompute."), 14);
  // The copies come first, keep the forward's signatures, and bwd.bda_mlp waits for the
  // repeated layer's last op.
  EXPECT_EQ(full.backward.op(0).id, "bwd.recompute.ln_attn");
  EXPECT_EQ(full.backward.op(2).signature(), plain.forward.op(2).signature());
  const int64_t bda = *full.backward.find("bwd.bda_mlp");
  EXPECT_EQ(full.backward.predecessors(bda),
            std::vector<int64_t>{*full.backward.find("bwd.recompute.bda_mlp")});
  EXPECT_TRUE(full.backward.is_acyclic());
}

TEST(Recompute, SelectiveRepeatsTheCoreAttention) {
  testing::Shape s;
  s.tp = 8;
  s.sp = true;
  const LayerDags plain = build_layer_dags(testing::make_job(testing::llama3_70b(), s), 0);
  const LayerDags sel = with_recompute(plain, RecomputeGranularity::kSelective);
  ASSERT_EQ(sel.backward.size(), 19);
  const int64_t copy = *sel.backward.find("bwd.recompute.flash_attn");
  // As Megatron's checkpoint re-runs it: once the gradient of its output exists.
  EXPECT_EQ(sel.backward.predecessors(copy),
            std::vector<int64_t>{*sel.backward.find("bwd.proj_dgrad")});
  const int64_t attn = *sel.backward.find("bwd.flash_attn");
  const std::vector<int64_t> preds = sel.backward.predecessors(attn);
  EXPECT_NE(std::find(preds.begin(), preds.end(), copy), preds.end());
  // With CP the ring (steps, exchanges, merge) is repeated: 2·cp - 1 + 1 ops.
  s.cp = 4;
  const LayerDags ring = build_layer_dags(testing::make_job(testing::llama3_70b(), s), 0);
  const LayerDags ring_sel = with_recompute(ring, RecomputeGranularity::kSelective);
  EXPECT_EQ(count_prefix(ring_sel.backward, "bwd.recompute."), 2 * 4);
  // The ring's first copies wait for the output's gradient too, the rest for the copies.
  const int64_t proj_dgrad = *ring_sel.backward.find("bwd.proj_dgrad");
  for (int64_t v = 0; v < ring_sel.backward.size(); ++v) {
    if (!ring_sel.backward.op(v).id.starts_with("bwd.recompute.")) continue;
    const std::vector<int64_t> p = ring_sel.backward.predecessors(v);
    EXPECT_FALSE(p.empty()) << ring_sel.backward.op(v).id;
    for (int64_t q : p) {
      EXPECT_TRUE(q == proj_dgrad || ring_sel.backward.op(q).id.starts_with("bwd.recompute."))
          << ring_sel.backward.op(v).id << " waits for " << ring_sel.backward.op(q).id;
    }
  }
  EXPECT_TRUE(ring_sel.backward.is_acyclic());
  EXPECT_EQ(with_recompute(ring, RecomputeGranularity::kNone).backward.size(),
            ring.backward.size());
}

// ----- the simulator --------------------------------------------------------------------

// pp 1, m 1, a chunk of 2 layers keeping 5 bytes (recompute) with 12 bytes recomputed during
// its backward: F0 at 0 holds 5; H0 (1-2) 5 + 10 logits, then 5; B0 (2-3) 5 + 12 at its
// start, 0 at its end.
TEST(Recompute, SimulatorChargesTheRecomputedGroup) {
  StageCosts c;
  c.forward_chunk_us = 1;
  c.backward_chunk_us = 1;
  c.head_loss_forward_us = 0.5;
  c.head_loss_backward_us = 0.5;
  c.layers_per_chunk = 2;
  c.activation_bytes_per_layer = 3;
  c.chunk_activation_bytes = 5;
  c.backward_transient_bytes = 12;
  c.head_loss_transient_bytes = 10;
  const PipelineSimulation sim = simulate_pipeline(make_one_f_one_b_schedule(1, 1), {c});
  std::string curve;
  for (const MemoryPoint& point : sim.stages[0].activation_curve) {
    curve +=
        std::to_string(static_cast<int>(point.time_us)) + ":" + std::to_string(point.bytes) + " ";
  }
  EXPECT_EQ(curve, "0:5 1:15 2:5 2:17 3:0 ");
  EXPECT_EQ(sim.stages[0].peak_activation_bytes, 17);
}

}  // namespace
}  // namespace dhelix
