// Fully sharded data parallelism in the job and the layer DAGs (Megatron-LM's
// --use-megatron-fsdp, --data-parallel-sharding-strategy; PyTorch FSDP2's
// reshard_after_forward): the spec, the job file, validation, the per-layer sizes
// (lib/fsdp_sizes.h) and the collectives of lib/dag_builder_fsdp.cc. Every byte count below
// is worked by hand in its comment.
#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "lib/error.h"
#include "lib/fsdp_sizes.h"
#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;
using testing::phi35_moe;
using Ids = std::set<std::string>;

Ids neighbours(const LayerDag& dag, const std::string& id, bool after) {
  Ids ids;
  const int64_t v = *dag.find(id);
  for (const int64_t i : after ? dag.successors(v) : dag.predecessors(v)) ids.insert(dag.op(i).id);
  return ids;
}

std::vector<std::string> messages(const JobSpec& job) {
  std::vector<std::string> out;
  const ProblemList problems = validate_job(job);
  for (const Problem& problem : problems.problems()) out.push_back(problem.to_string());
  return out;
}

JobSpec with_fsdp(JobSpec job, FsdpShardingStrategy strategy, bool reshard = true) {
  job.parallel.use_megatron_fsdp = true;
  job.parallel.fsdp_sharding = strategy;
  job.parallel.fsdp_reshard_after_forward = reshard;
  return job;
}

// Llama-3-70B, tp 8 with SP, dp 8: one TP group per node, the DP group across 8 nodes.
JobSpec llama_zero3(bool reshard = true) {
  return with_fsdp(make_job(llama3_70b(), {.tp = 8, .dp = 8, .sp = true, .seq = 8192}),
                   FsdpShardingStrategy::kOptimGradsParams, reshard);
}

// ---------------------------------------------------------------- spec, reader, validation

TEST(Fsdp, NamesAreMegatronsSpellingAndDefaultsAreMegatronsAndFsdp2s) {
  EXPECT_EQ(kFsdpShardingStrategyNames.all(),
            (std::vector<std::string>{"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  const ParallelSpec p;
  EXPECT_FALSE(p.use_megatron_fsdp);
  EXPECT_EQ(p.fsdp_sharding, FsdpShardingStrategy::kNoShard);  // Megatron-LM's default
  EXPECT_TRUE(p.fsdp_reshard_after_forward);                   // FSDP2's default
  EXPECT_FALSE(p.fsdp_shards_parameters());
  EXPECT_TRUE(p.shards_optimizer());  // dhelix plans with the distributed optimizer
  ParallelSpec f = p;
  f.use_megatron_fsdp = true;
  EXPECT_FALSE(f.shards_optimizer());  // no_shard: DDP
  f.fsdp_sharding = FsdpShardingStrategy::kOptim;
  EXPECT_TRUE(f.shards_optimizer());
  EXPECT_FALSE(f.fsdp_shards_parameters());
  f.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  EXPECT_TRUE(f.fsdp_shards_parameters());
}

TEST(Fsdp, JobFileRoundTripsAndRefusesAnUnknownStrategy) {
  ParallelSpec p;
  EXPECT_FALSE(parallel_to_json(p).contains("use_megatron_fsdp"));  // off: absent
  p.use_megatron_fsdp = true;
  p.fsdp_sharding = FsdpShardingStrategy::kOptimGrads;
  p.fsdp_reshard_after_forward = false;
  const OrderedJson json = parallel_to_json(p);
  EXPECT_EQ(json["use_megatron_fsdp"], true);
  EXPECT_EQ(json["data_parallel_sharding_strategy"], "optim_grads");
  EXPECT_EQ(json["fsdp_reshard_after_forward"], false);

  const std::string path = ::testing::TempDir() + "/fsdp_job.json";
  const std::string source = DHELIX_SOURCE_DIR;
  auto write = [&](const std::string& parallel) {
    std::ofstream(path)
        << R"({"schema_version": "1.0.0", "name": "t", "model": ")" + source +
               R"(/examples/models/llama-tiny.json", "cluster": "a40", "parallel": )" + parallel +
               "}";
  };
  write(R"({"dp": 4, "seq_length": 64, "global_batch_size": 8, "use_megatron_fsdp": true,
            "data_parallel_sharding_strategy": "optim_grads_params",
            "fsdp_reshard_after_forward": false})");
  const JobSpec job = read_job_file(path);
  EXPECT_TRUE(job.parallel.use_megatron_fsdp);
  EXPECT_EQ(job.parallel.fsdp_sharding, FsdpShardingStrategy::kOptimGradsParams);
  EXPECT_FALSE(job.parallel.fsdp_reshard_after_forward);
  write(R"({"dp": 4, "seq_length": 64, "global_batch_size": 8, "use_megatron_fsdp": true,
            "data_parallel_sharding_strategy": "zero3"})");
  try {
    read_job_file(path);
    ADD_FAILURE() << "an unknown sharding strategy was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/parallel/data_parallel_sharding_strategy: \"zero3\""), std::string::npos)
        << what;
    EXPECT_NE(what.find("optim_grads_params"), std::string::npos) << what;
  }
}

TEST(Fsdp, ValidationRefusesWhatIsNotModelledByName) {
  EXPECT_EQ(messages(llama_zero3()), std::vector<std::string>{});
  EXPECT_EQ(messages(llama_zero3(false)), std::vector<std::string>{});
  // The strategy and the reshard choice without Megatron-FSDP.
  JobSpec plain = make_job(llama3_70b(), {.tp = 8, .dp = 8, .sp = true, .seq = 8192});
  plain.parallel.fsdp_sharding = FsdpShardingStrategy::kOptim;
  plain.parallel.fsdp_reshard_after_forward = false;
  EXPECT_EQ(messages(plain),
            (std::vector<std::string>{
                "job.json: /parallel/data_parallel_sharding_strategy: optim applies only with "
                "use_megatron_fsdp: true (Megatron-LM's --data-parallel-sharding-strategy is "
                "Megatron-FSDP's)",
                "job.json: /parallel/fsdp_reshard_after_forward: false applies only with "
                "use_megatron_fsdp: true"}));
  // dp = 1: nothing to shard.
  const JobSpec dp1 = with_fsdp(make_job(llama3_70b(), {.tp = 8, .dp = 1, .sp = true}),
                                FsdpShardingStrategy::kOptim);
  EXPECT_EQ(messages(dp1), std::vector<std::string>{
                               "job.json: /parallel/dp: 1 use_megatron_fsdp shards over the "
                               "data-parallel ranks: dp = 1 has nothing to shard (set dp > 1, or "
                               "leave use_megatron_fsdp out)"});
  // reshard_after_forward = false where nothing is gathered.
  EXPECT_EQ(messages(with_fsdp(plain, FsdpShardingStrategy::kOptimGrads, false)),
            std::vector<std::string>{
                "job.json: /parallel/fsdp_reshard_after_forward: false applies only with "
                "data_parallel_sharding_strategy optim_grads_params (it is optim_grads): only "
                "then are the parameters gathered"});
  // ZeRO-3 with context parallelism (refused), with full recompute (allowed).
  JobSpec cp = with_fsdp(make_job(llama3_70b(), {.tp = 8, .cp = 2, .dp = 4, .sp = true}),
                         FsdpShardingStrategy::kOptimGradsParams);
  cp.parallel.recompute.granularity = RecomputeGranularity::kFull;
  EXPECT_EQ(messages(cp),
            (std::vector<std::string>{
                "job.json: /parallel/cp: 2 is not supported with data_parallel_sharding_strategy "
                "optim_grads_params in this version (Megatron-FSDP shards over dp·cp with "
                "context parallelism; dhelix shards over dp only)"}));
  JobSpec full = llama_zero3();
  full.parallel.recompute.granularity = RecomputeGranularity::kFull;
  EXPECT_EQ(messages(full), std::vector<std::string>{});
  // A mixture of experts: its experts shard over the expert-data-parallel group.
  const JobSpec moe =
      with_fsdp(make_job(phi35_moe(), {.dp = 8, .ep = 8}), FsdpShardingStrategy::kOptimGradsParams);
  EXPECT_EQ(messages(moe), std::vector<std::string>{});
}

// ---------------------------------------------------------------- sizes

TEST(Fsdp, LayerSizesSplitTheMatricesOverTpAndKeepTheNormsWhole) {
  // Llama-3-70B: QKV 8192·(8192 + 2·1024) = 83,886,080, proj 8192·8192 = 67,108,864,
  // fc1 8192·57,344 = 469,762,048, fc2 28,672·8192 = 234,881,024: 855,638,016 matrix
  // weights, / tp 8 = 106,954,752, plus two RMSNorm scales of 8192 = 106,971,136.
  const JobSpec job = llama_zero3();
  EXPECT_EQ(fsdp_layer_parameters(job.model, job.parallel), 106'971'136);
  EXPECT_EQ(fsdp_gather_bytes(job.model, job.parallel), 213'942'272);          // bf16
  EXPECT_EQ(fsdp_reduce_scatter_bytes(job.model, job.parallel), 427'884'544);  // fp32
  EXPECT_EQ(fsdp_gradient_dtype(job.parallel), DType::kFp32);
  ParallelSpec bf16 = job.parallel;
  bf16.grad_reduce_in_bf16 = true;
  EXPECT_EQ(fsdp_reduce_scatter_bytes(job.model, bf16), 213'942'272);
  EXPECT_EQ(fsdp_gradient_dtype(bf16), DType::kBf16);
  // tp 1: 855,638,016 + 16,384.
  ParallelSpec tp1 = job.parallel;
  tp1.tp = 1;
  EXPECT_EQ(fsdp_layer_parameters(job.model, tp1), 855'654'400);
}

// ---------------------------------------------------------------- the layer DAGs

TEST(Fsdp, GathersPrecedeEveryWeightReaderAndTheReduceScatterFollowsEveryWeightGradient) {
  const LayerDags dags = build_layer_dags(llama_zero3(), 0);
  const LayerDags plain =
      build_layer_dags(make_job(llama3_70b(), {.tp = 8, .dp = 8, .sp = true, .seq = 8192}), 0);
  EXPECT_EQ(dags.forward.size(), plain.forward.size() + 1);    // fwd.fsdp_gather
  EXPECT_EQ(dags.backward.size(), plain.backward.size() + 2);  // gather, reduce-scatter

  const Op& gather = dags.forward.op(0);  // index 0: before everything
  EXPECT_EQ(gather.id, "fwd.fsdp_gather");
  EXPECT_EQ(gather.kind, OpKind::kAllGather);
  EXPECT_EQ(gather.group, ParallelDim::kDp);
  EXPECT_EQ(gather.group_size, 8);
  EXPECT_EQ(gather.comm_bytes, 213'942'272);
  EXPECT_EQ(gather.dtype, DType::kBf16);
  // Ranks 0, 8, ..., 56 live on 8 nodes of 8 GPUs.
  EXPECT_EQ(gather.scope, GroupScope::kCrossNode);
  EXPECT_EQ(gather.nodes_spanned, 8);
  EXPECT_EQ(gather.stream, StreamClass::kCrossComm);
  EXPECT_EQ(gather.signature(), "all_gather:bf16:bytes=213942272:dp8:cross-node:nodes=8");
  EXPECT_TRUE(dags.forward.predecessors(0).empty());
  EXPECT_EQ(neighbours(dags.forward, "fwd.fsdp_gather", true),
            (Ids{"fwd.ln_attn", "fwd.gemm_qkv", "fwd.gemm_proj", "fwd.ln_mlp", "fwd.gemm_fc1",
                 "fwd.gemm_fc2"}));

  EXPECT_EQ(dags.backward.op(0).id, "bwd.fsdp_gather");
  EXPECT_EQ(dags.backward.op(0).signature(), gather.signature());  // same size, group
  EXPECT_EQ(neighbours(dags.backward, "bwd.fsdp_gather", true),
            (Ids{"bwd.fc2_dgrad", "bwd.fc1_dgrad", "bwd.ln_mlp", "bwd.proj_dgrad", "bwd.qkv_dgrad",
                 "bwd.ln_attn"}));
  const Op& scatter = dags.backward.op(*dags.backward.find("bwd.fsdp_reduce_scatter"));
  EXPECT_EQ(scatter.kind, OpKind::kReduceScatter);
  EXPECT_EQ(scatter.group, ParallelDim::kDp);
  EXPECT_EQ(scatter.comm_bytes, 427'884'544);
  EXPECT_EQ(scatter.dtype, DType::kFp32);
  EXPECT_TRUE(scatter.movable_sink);
  EXPECT_EQ(backward_work(scatter), BackwardWork::kWeightGradient);  // W of a split backward
  EXPECT_EQ(neighbours(dags.backward, "bwd.fsdp_reduce_scatter", false),
            (Ids{"bwd.fc2_wgrad", "bwd.fc1_wgrad", "bwd.ln_mlp", "bwd.proj_wgrad", "bwd.qkv_wgrad",
                 "bwd.ln_attn"}));
  EXPECT_TRUE(neighbours(dags.backward, "bwd.fsdp_reduce_scatter", true).empty());
  EXPECT_TRUE(dags.forward.is_acyclic() && dags.backward.is_acyclic());
  // The layer's output op: ln_attn, the one op no movable sink that only movable sinks follow
  // (lib/plan/rank_dags.cc).
  Ids outputs;
  for (int64_t v = 0; v < dags.backward.size(); ++v) {
    bool only_sinks = !dags.backward.op(v).movable_sink;
    for (const int64_t s : dags.backward.successors(v))
      only_sinks &= dags.backward.op(s).movable_sink;
    if (only_sinks) outputs.insert(dags.backward.op(v).id);
  }
  EXPECT_EQ(outputs, Ids{"bwd.ln_attn"});
}

TEST(Fsdp, WithoutReshardAfterForwardTheBackwardGathersNothing) {
  const LayerDags dags = build_layer_dags(llama_zero3(false), 0);
  EXPECT_TRUE(dags.forward.find("fwd.fsdp_gather").has_value());
  EXPECT_FALSE(dags.backward.find("bwd.fsdp_gather").has_value());
  EXPECT_TRUE(dags.backward.find("bwd.fsdp_reduce_scatter").has_value());
  EXPECT_EQ(dags.backward.op(0).id, "bwd.bda_mlp");
}

TEST(Fsdp, ZeroOneAndTwoAddNothingToTheLayers) {
  const JobSpec plain = make_job(llama3_70b(), {.tp = 8, .dp = 8, .sp = true, .seq = 8192});
  for (const FsdpShardingStrategy s : {FsdpShardingStrategy::kNoShard, FsdpShardingStrategy::kOptim,
                                       FsdpShardingStrategy::kOptimGrads}) {
    const LayerDags dags = build_layer_dags(with_fsdp(plain, s), 0);
    const LayerDags base = build_layer_dags(plain, 0);
    EXPECT_EQ(dags.forward.size(), base.forward.size()) << fsdp_sharding_strategy_name(s);
    EXPECT_EQ(dags.backward.size(), base.backward.size()) << fsdp_sharding_strategy_name(s);
  }
}

TEST(Fsdp, IntraBatchRewriteAndSelectiveRecomputeKeepTheCollectives) {
  const JobSpec job = llama_zero3();
  const LayerDags intra = build_intra_batch_layer_dags(job, 0);
  // The gather now feeds the first chunk of the decomposed QKV GEMM and fc1.
  const Ids after = neighbours(intra.forward, "fwd.fsdp_gather", true);
  EXPECT_TRUE(after.count("fwd.gemm_qkv.chunk0")) << after.size();
  EXPECT_TRUE(after.count("fwd.gemm_fc1.chunk0"));
  EXPECT_TRUE(intra.backward.find("bwd.fsdp_reduce_scatter").has_value());
  const LayerDags selective =
      with_recompute(build_layer_dags(job, 0), RecomputeGranularity::kSelective);
  EXPECT_TRUE(selective.backward.find("bwd.fsdp_gather").has_value());
  EXPECT_TRUE(selective.backward.is_acyclic());
}

// Full recompute under FSDP repeats the forward but not its gather: the backward's gather
// comes first and every repeated weight reader waits for it (with reshard); without
// reshard the backward gathers nothing and the repeat reads the kept weights.
TEST(Fsdp, FullRecomputeReplaysOnTheBackwardsGather) {
  for (const bool reshard : {true, false}) {
    SCOPED_TRACE(reshard ? "reshard" : "kept");
    const LayerDags plain = build_layer_dags(llama_zero3(reshard), 0);
    const LayerDags dags = with_recompute(plain, RecomputeGranularity::kFull);
    const LayerDag& b = dags.backward;
    EXPECT_TRUE(b.is_acyclic());
    EXPECT_FALSE(b.find("bwd.recompute.fsdp_gather").has_value());
    // Every forward op but the gather is repeated.
    EXPECT_EQ(b.size(), plain.backward.size() + plain.forward.size() - 1);
    int64_t gathers = 0;
    for (int64_t v = 0; v < b.size(); ++v)
      gathers += b.op(v).kind == OpKind::kAllGather && b.op(v).group == ParallelDim::kDp;
    EXPECT_EQ(gathers, reshard ? 1 : 0);
    if (!reshard) continue;
    ASSERT_EQ(b.op(0).id, "bwd.fsdp_gather");  // first, as the file comment wants
    EXPECT_TRUE(b.predecessors(0).empty());
    const Ids after = neighbours(b, "bwd.fsdp_gather", true);
    // The forward's weight readers, repeated, and the backward's own (dgrads, norms).
    for (const char* id :
         {"bwd.recompute.ln_attn", "bwd.recompute.gemm_qkv", "bwd.recompute.gemm_proj",
          "bwd.recompute.ln_mlp", "bwd.recompute.gemm_fc1", "bwd.recompute.gemm_fc2",
          "bwd.fc2_dgrad", "bwd.qkv_dgrad"}) {
      EXPECT_TRUE(after.count(id)) << id;
    }
    EXPECT_FALSE(after.count("bwd.recompute.flash_attn"));  // reads no weights
    // The backward's own first ops still wait for the repeat.
    EXPECT_TRUE(neighbours(b, "bwd.bda_mlp", false).count("bwd.recompute.bda_mlp"));
  }
}

TEST(Fsdp, TinyExampleHasTheCollectivesOverFourLocalRanks) {
  const JobSpec job =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-fsdp-dp4.json");
  EXPECT_EQ(messages(job), std::vector<std::string>{});
  const LayerDags dags = build_layer_dags(job, 0);
  // llama-tiny (fp32): QKV 64·(64 + 2·32) = 8192, proj 4096, fc1 64·256 = 16,384,
  // fc2 128·64 = 8192, norms 2·64: 36,992 parameters, 147,968 bytes in fp32.
  const Op& gather = dags.forward.op(0);
  EXPECT_EQ(gather.comm_bytes, 147'968);
  EXPECT_EQ(gather.group_size, 4);
  EXPECT_EQ(gather.scope, GroupScope::kLocal);
  const Op& scatter = dags.backward.op(*dags.backward.find("bwd.fsdp_reduce_scatter"));
  EXPECT_EQ(scatter.comm_bytes, 147'968);  // fp32 gradients
}

}  // namespace
}  // namespace dhelix
