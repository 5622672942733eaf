// Activation recompute under the CP communication types other than the ring
// (--cp-comm-type a2a, allgather, a2a+p2p): the recompute DAGs repeat the core attention's
// CP collectives as Megatron's checkpoint of TE's attention does
// (lib/dag_builder_recompute.cc), and full recompute keeps less than storing.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "planner/memory_model.h"
#include "planner/pipeline_schedule.h"
#include "planner/scheme_memory.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

JobSpec cp_job(CpCommType type, RecomputeGranularity granularity = RecomputeGranularity::kNone) {
  JobSpec job = make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768});
  job.parallel.cp_comm_type = type;
  if (type == CpCommType::kA2aP2p) job.parallel.hierarchical_cp_sizes = {2, 2};
  job.parallel.recompute.granularity = granularity;
  return job;
}

// Llama-3-70B's 64 query and 8 KV heads leave 8 and 1 per TP rank: a2a needs heads the CP
// group splits, so its jobs take 32 KV heads (4 per TP rank).
JobSpec a2a_job(CpCommType type, RecomputeGranularity granularity = RecomputeGranularity::kNone) {
  JobSpec job = cp_job(type, granularity);
  job.model.num_kv_heads = 32;
  return job;
}

std::vector<std::string> repeated(const LayerDag& dag) {
  std::vector<std::string> ids;
  for (int64_t v : dag.topological_order()) {
    if (dag.op(v).id.starts_with("bwd.recompute.")) ids.push_back(dag.op(v).id);
  }
  return ids;
}

std::vector<std::string> preds(const LayerDag& dag, const std::string& id) {
  std::vector<std::string> ids;
  for (int64_t p : dag.predecessors(*dag.find(id))) ids.push_back(dag.op(p).id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool waits_for(const LayerDag& dag, const std::string& op, const std::string& on) {
  const std::vector<std::string> p = preds(dag, op);
  return std::find(p.begin(), p.end(), on) != p.end();
}

// ---------------------------------------------------------------- the recompute DAGs

TEST(CpRecomputeDag, SelectiveUlyssesRepeatsBothAllToAllsAroundTheAttention) {
  const LayerDags plain = build_layer_dags(a2a_job(CpCommType::kA2a), 0);
  const LayerDags sel = with_recompute(plain, RecomputeGranularity::kSelective);
  // TE's AttnFuncWithCPAndQKVOA2A runs both all-to-alls inside the checkpointed attention.
  EXPECT_EQ(repeated(sel.backward),
            (std::vector<std::string>{"bwd.recompute.qkv_a2a", "bwd.recompute.flash_attn",
                                      "bwd.recompute.out_a2a"}));
  EXPECT_EQ(sel.backward.size(), plain.backward.size() + 3);
  // Once the gradient of the attention's output exists (the checkpoint's backward), and the
  // attention backward, dO's all-to-all first, after the repeated forward.
  EXPECT_EQ(preds(sel.backward, "bwd.recompute.qkv_a2a"),
            std::vector<std::string>{"bwd.proj_dgrad"});
  EXPECT_TRUE(waits_for(sel.backward, "bwd.dout_a2a", "bwd.recompute.out_a2a"));
  EXPECT_TRUE(waits_for(sel.backward, "bwd.flash_attn", "bwd.recompute.out_a2a"));
  // The repeated all-to-all is the forward's: same group, bytes and signature.
  const Op& copy = sel.backward.op(*sel.backward.find("bwd.recompute.qkv_a2a"));
  const Op& original = plain.forward.op(*plain.forward.find("fwd.qkv_a2a"));
  EXPECT_EQ(copy.kind, OpKind::kAllToAll);
  EXPECT_EQ(copy.group, ParallelDim::kCp);
  EXPECT_EQ(copy.signature(), original.signature());
  EXPECT_TRUE(sel.backward.is_acyclic());
}

TEST(CpRecomputeDag, SelectiveAllGatherRepeatsTheGatherAndTheBackwardGathersAfterIt) {
  const LayerDags plain = build_layer_dags(cp_job(CpCommType::kAllGather), 0);
  const LayerDags sel = with_recompute(plain, RecomputeGranularity::kSelective);
  EXPECT_EQ(repeated(sel.backward),
            (std::vector<std::string>{"bwd.recompute.kv_allgather", "bwd.recompute.flash_attn"}));
  // fwd.flash_attn reads gemm_qkv's q (kept, not repeated) besides the gathered K/V: its
  // copy waits for the gather's copy only, which waits for the output's gradient.
  EXPECT_EQ(preds(sel.backward, "bwd.recompute.kv_allgather"),
            std::vector<std::string>{"bwd.proj_dgrad"});
  EXPECT_EQ(preds(sel.backward, "bwd.recompute.flash_attn"),
            std::vector<std::string>{"bwd.recompute.kv_allgather"});
  // TE's backward gathers K and V again after the checkpoint's forward.
  EXPECT_TRUE(waits_for(sel.backward, "bwd.kv_allgather", "bwd.recompute.flash_attn"));
  EXPECT_TRUE(sel.backward.is_acyclic());
}

TEST(CpRecomputeDag, SelectiveHierarchicalRepeatsTheSubGroupAllToAllsAndTheRing) {
  const LayerDags plain = build_layer_dags(a2a_job(CpCommType::kA2aP2p), 0);
  const LayerDags sel = with_recompute(plain, RecomputeGranularity::kSelective);
  // The ring over P = 2 sub-groups: 2 steps, 1 exchange, the merge; and both all-to-alls.
  const std::vector<std::string> ids = repeated(sel.backward);
  EXPECT_EQ(ids.size(), 2u + 2 + 1 + 1);
  EXPECT_EQ(ids.front(), "bwd.recompute.qkv_a2a");
  EXPECT_EQ(ids.back(), "bwd.recompute.out_a2a");
  EXPECT_EQ(preds(sel.backward, "bwd.recompute.qkv_a2a"),
            std::vector<std::string>{"bwd.proj_dgrad"});
  EXPECT_TRUE(waits_for(sel.backward, "bwd.dout_a2a", "bwd.recompute.out_a2a"));
  EXPECT_TRUE(sel.backward.is_acyclic());
}

TEST(CpRecomputeDag, FullRepeatsEveryForwardOpCollectivesIncluded) {
  for (const JobSpec& job :
       {a2a_job(CpCommType::kA2a), cp_job(CpCommType::kAllGather), a2a_job(CpCommType::kA2aP2p)}) {
    const LayerDags plain = build_layer_dags(job, 0);
    const LayerDags full = with_recompute(plain, RecomputeGranularity::kFull);
    EXPECT_EQ(static_cast<int64_t>(repeated(full.backward).size()), plain.forward.size())
        << cp_comm_type_name(job.parallel.cp_comm_type);
    EXPECT_TRUE(full.backward.is_acyclic());
  }
}

TEST(CpRecomputeDag, TheRingsSelectiveDagIsUnchanged) {
  // p2p has no CP all-to-all or all-gather: the ring's steps, exchanges and merge only.
  const LayerDags ring = build_layer_dags(cp_job(CpCommType::kP2p), 0);
  EXPECT_EQ(repeated(with_recompute(ring, RecomputeGranularity::kSelective).backward).size(),
            2u * 4);
}

// ---------------------------------------------------------------- memory

TEST(CpRecomputeMemory, FullRecomputeKeepsLessThanStoringForEveryType) {
  for (CpCommType type : {CpCommType::kA2a, CpCommType::kAllGather, CpCommType::kA2aP2p}) {
    // 1F1B's stage 0 of pp 2 (8 layers; the head, whose logits would dominate, is on
    // stage 1), the DHelix W's stage 0 (the head's logits on top of both).
    JobSpec stored = type == CpCommType::kAllGather ? cp_job(type) : a2a_job(type);
    stored.model.num_layers = 16;
    stored.parallel.pp = 2;
    JobSpec full = stored;
    full.parallel.recompute.granularity = RecomputeGranularity::kFull;
    for (PipelineScheme scheme : {PipelineScheme::kMegatron1F1B, PipelineScheme::kDHelix}) {
      const int64_t kept = scheme_memory(stored, scheme, {})[0].activation_bytes;
      const int64_t recomputed = scheme_memory(full, scheme, {})[0].activation_bytes;
      EXPECT_LT(recomputed, kept) << cp_comm_type_name(type);
    }
    // Without the head: each layer keeps its input (2·8192·8192 / 8 bytes = 16 MiB with SP)
    // and the backward holds one recomputed layer instead of all the stored ones: under half.
    EXPECT_LT(2 * scheme_memory(full, PipelineScheme::kMegatron1F1B, {})[0].activation_bytes,
              scheme_memory(stored, PipelineScheme::kMegatron1F1B, {})[0].activation_bytes)
        << cp_comm_type_name(type);
  }
}

}  // namespace
}  // namespace dhelix
