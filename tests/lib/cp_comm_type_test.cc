// Megatron-LM's --cp-comm-type: the spec, the job file, validation, the hierarchical CP
// sub-groups and the layer DAGs of a2a (Ulysses), allgather and a2a+p2p
// (lib/dag_builder_cp_a2a.cc). Every byte count below is worked by hand in its comment.
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/placement.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;
using Ids = std::vector<std::string>;

Ids ids_of(const LayerDag& dag) {
  Ids ids;
  for (const int64_t i : dag.topological_order()) ids.push_back(dag.op(i).id);
  return ids;
}

// The ops of `dag` from `first` to `last` in its topological order.
Ids window(const LayerDag& dag, const std::string& first, const std::string& last) {
  const Ids all = ids_of(dag);
  Ids out;
  bool inside = false;
  for (const std::string& id : all) {
    inside = inside || id == first;
    if (inside) out.push_back(id);
    if (id == last) break;
  }
  return out;
}

Ids predecessors(const LayerDag& dag, const std::string& id) {
  Ids ids;
  for (const int64_t i : dag.predecessors(*dag.find(id))) ids.push_back(dag.op(i).id);
  return ids;
}

const Op& op_of(const LayerDag& dag, const std::string& id) {
  const auto index = dag.find(id);
  EXPECT_TRUE(index.has_value()) << id;
  return dag.op(index.value_or(0));
}

JobSpec with_type(JobSpec job, CpCommType type, std::vector<int64_t> sizes = {}) {
  job.parallel.cp_comm_type = type;
  job.parallel.hierarchical_cp_sizes = std::move(sizes);
  return job;
}

std::vector<std::string> messages(const JobSpec& job) {
  std::vector<std::string> out;
  const ProblemList problems = validate_job(job);
  for (const Problem& problem : problems.problems()) out.push_back(problem.to_string());
  return out;
}

double total_attention_flops(const LayerDag& dag) {
  double flops = 0;
  for (int64_t i = 0; i < dag.size(); ++i) {
    if (dag.op(i).kind == OpKind::kAttention) flops += dag.op(i).flops;
  }
  return flops;
}

// ---------------------------------------------------------------- spec, reader, validation

TEST(CpCommType, NamesAreMegatronsSpellingAndGroupsFollowTheType) {
  EXPECT_EQ(kCpCommTypeNames.all(),
            (std::vector<std::string>{"p2p", "a2a", "allgather", "a2a+p2p"}));
  ParallelSpec p;
  p.cp = 8;
  EXPECT_EQ(p.cp_ring_group(), 8);  // p2p, the default
  EXPECT_EQ(p.cp_a2a_group(), 1);
  p.cp_comm_type = CpCommType::kA2a;
  EXPECT_EQ(p.cp_a2a_group(), 8);
  EXPECT_EQ(p.cp_ring_group(), 1);
  p.cp_comm_type = CpCommType::kAllGather;
  EXPECT_EQ(p.cp_a2a_group(), 1);
  EXPECT_EQ(p.cp_ring_group(), 1);
  p.cp_comm_type = CpCommType::kA2aP2p;
  p.hierarchical_cp_sizes = {2, 4};
  EXPECT_EQ(p.cp_a2a_group(), 2);
  EXPECT_EQ(p.cp_ring_group(), 4);
}

TEST(CpCommType, JobFileRoundTripsTypeAndHierarchicalSizes) {
  ParallelSpec p;
  p.cp = 4;
  p.cp_comm_type = CpCommType::kA2aP2p;
  p.hierarchical_cp_sizes = {2, 2};
  const OrderedJson json = parallel_to_json(p);
  EXPECT_EQ(json["cp_comm_type"], "a2a+p2p");
  EXPECT_EQ(json["hierarchical_context_parallel_sizes"].dump(), "[2,2]");
  EXPECT_FALSE(parallel_to_json(ParallelSpec{}).contains("cp_comm_type"));  // p2p: absent

  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/cp_comm_type_job.json";
  const std::string source = DHELIX_SOURCE_DIR;
  auto write = [&](const std::string& parallel) {
    std::ofstream(path)
        << R"({"schema_version": "1.0.0", "name": "t", "model": ")" + source +
               R"(/examples/models/llama-tiny.json", "cluster": "a40", "parallel": )" + parallel +
               "}";
  };
  write(R"({"cp": 4, "seq_length": 64, "global_batch_size": 4, "cp_comm_type": "a2a+p2p",
            "hierarchical_context_parallel_sizes": [2, 2]})");
  const JobSpec job = read_job_file(path);
  EXPECT_EQ(job.parallel.cp_comm_type, CpCommType::kA2aP2p);
  EXPECT_EQ(job.parallel.hierarchical_cp_sizes, (std::vector<int64_t>{2, 2}));

  write(R"({"cp": 2, "seq_length": 64, "global_batch_size": 4, "cp_comm_type": "ulysses"})");
  try {
    read_job_file(path);
    ADD_FAILURE() << "an unknown cp_comm_type was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/parallel/cp_comm_type: \"ulysses\""), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("a2a+p2p"), std::string::npos) << e.what();
  }
  write(R"({"cp": 2, "seq_length": 64, "global_batch_size": 4,
            "hierarchical_context_parallel_sizes": "2x2"})");
  try {
    read_job_file(path);
    ADD_FAILURE() << "a non-list hierarchical_context_parallel_sizes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/parallel/hierarchical_context_parallel_sizes: \"2x2\" "
                                         "must be a list of integers"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpCommType, UlyssesNeedsQueryAndKvHeadsPerTpRankDivisibleByCp) {
  // Llama-3-70B: 64 query and 8 KV heads; tp 8 leaves 8 and 1 a rank.
  const JobSpec job = make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768});
  EXPECT_EQ(messages(with_type(job, CpCommType::kA2a)),
            std::vector<std::string>{
                "job.json: /parallel/cp_comm_type: a2a splits the heads of each TP rank over cp "
                "= 4, which does not divide num_kv_heads / tp = 8 / 8 = 1 (Ulysses' all-to-all "
                "gives every rank of its group an equal share of the query and of the KV heads)"});
  // tp 2: 32 query and 4 KV heads a rank, both divisible by 4.
  const JobSpec tp2 = make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768});
  EXPECT_EQ(messages(with_type(tp2, CpCommType::kA2a)), std::vector<std::string>{});
  // The ring and the all-gather split no heads.
  EXPECT_EQ(messages(with_type(job, CpCommType::kAllGather)), std::vector<std::string>{});
}

TEST(CpCommType, HierarchicalSizesFollowMegatronsRules) {
  const JobSpec job = make_job(llama3_70b(), {.tp = 4, .cp = 4, .sp = true, .seq = 32768});
  const std::string rule =
      "cp_comm_type a2a+p2p needs two sizes [A, P], each at least 2, with A·P = cp = 4 (A "
      "adjacent CP ranks do the all-to-all, the ring spans P sub-groups; Megatron-LM's "
      "--hierarchical-context-parallel-sizes)";
  EXPECT_EQ(messages(with_type(job, CpCommType::kA2aP2p)),
            std::vector<std::string>{
                "job.json: /parallel/hierarchical_context_parallel_sizes: (absent) " + rule});
  EXPECT_EQ(messages(with_type(job, CpCommType::kA2aP2p, {2, 4})),
            std::vector<std::string>{
                "job.json: /parallel/hierarchical_context_parallel_sizes: [2, 4] " + rule});
  EXPECT_EQ(messages(with_type(job, CpCommType::kA2aP2p, {2, 2})), std::vector<std::string>{});
  // A = 4 would split tp 4's 2 KV heads four ways.
  JobSpec wide = make_job(llama3_70b(), {.tp = 4, .cp = 8, .sp = true, .seq = 32768});
  EXPECT_EQ(messages(with_type(wide, CpCommType::kA2aP2p, {4, 2})),
            std::vector<std::string>{
                "job.json: /parallel/cp_comm_type: a2a+p2p splits the heads of each TP rank over "
                "the a2a sub-group A = 4, which does not divide num_kv_heads / tp = 8 / 4 = 2 "
                "(Ulysses' all-to-all gives every rank of its group an equal share of the query "
                "and of the KV heads)"});
  EXPECT_EQ(messages(with_type(job, CpCommType::kP2p, {2, 2})),
            std::vector<std::string>{"job.json: /parallel/hierarchical_context_parallel_sizes: "
                                     "[2, 2] applies to cp_comm_type a2a+p2p only (cp_comm_type "
                                     "is p2p)"});
}

TEST(CpCommType, HierarchicalSubGroupsAreAdjacentCpRanksAndTheirStride) {
  // tp 4, cp 4 on 8-GPU nodes: rank = tp + 4·cp, so rank 0's CP group is {0, 4, 8, 12} over
  // nodes 0, 0, 1, 1. A = 2: the all-to-all over CP ranks {0, 1} = {0, 4} (one node), the
  // ring over CP ranks {0, 2} = {0, 8} (two nodes).
  ParallelSpec p;
  p.tp = 4;
  p.cp = 4;
  const Placement placement(p, 8);
  const ProcessGroup a2a = placement.cp_sub_group(0, 2, Placement::CpLevel::kA2a);
  EXPECT_EQ(a2a.ranks, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(a2a.scope, GroupScope::kLocal);
  const ProcessGroup ring = placement.cp_sub_group(0, 2, Placement::CpLevel::kRing);
  EXPECT_EQ(ring.ranks, (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(ring.scope, GroupScope::kCrossNode);
  EXPECT_EQ(ring.nodes_spanned, 2);
  EXPECT_EQ(placement.cp_sub_group(13, 2, Placement::CpLevel::kA2a).ranks,
            (std::vector<int64_t>{9, 13}));
  EXPECT_EQ(placement.cp_sub_group(13, 2, Placement::CpLevel::kRing).ranks,
            (std::vector<int64_t>{5, 13}));
}

// ---------------------------------------------------------------- layer DAGs

TEST(CpCommType, UlyssesForwardAndBackwardWrapTheAttentionInAllToAlls) {
  // Llama-3-70B, tp 2, cp 4, 32k, SP: T = 8192 tokens a rank; 32 query and 4 KV heads a TP
  // rank, head_dim 128, bf16. CP group of rank 0: {0, 2, 4, 6}, one node.
  const JobSpec job = with_type(
      make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768}), CpCommType::kA2a);
  const LayerDags dags = build_layer_dags(job, 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(window(f, "fwd.gemm_qkv", "fwd.gemm_proj"),
            (Ids{"fwd.gemm_qkv", "fwd.qkv_a2a", "fwd.flash_attn", "fwd.out_a2a", "fwd.gemm_proj"}));
  const Op& qkv = op_of(f, "fwd.qkv_a2a");
  EXPECT_EQ(qkv.kind, OpKind::kAllToAll);
  // Q, K, V of T tokens: 8192 · (32 + 4 + 4) · 128 · 2 bytes = 83,886,080.
  EXPECT_EQ(qkv.comm_bytes, 83886080);
  EXPECT_EQ(qkv.group, ParallelDim::kCp);
  EXPECT_EQ(qkv.group_size, 4);
  EXPECT_EQ(qkv.scope, GroupScope::kLocal);
  EXPECT_EQ(qkv.stream, StreamClass::kLocalComm);
  // O back: 8192 · 32 · 128 · 2 = 67,108,864.
  EXPECT_EQ(op_of(f, "fwd.out_a2a").comm_bytes, 67108864);
  // The whole sequence on 32/4 = 8 query and 4/4 = 1 KV heads.
  const Op& attention = op_of(f, "fwd.flash_attn");
  EXPECT_EQ(attention.shape.heads, 8);
  EXPECT_EQ(attention.shape.kv_heads, 1);
  EXPECT_EQ(attention.shape.q_len, 32768);
  EXPECT_EQ(attention.shape.kv_len, 32768);
  EXPECT_TRUE(attention.shape.causal);
  // Reads Q, K, V: 32768 · (8 + 1 + 1) · 128 · 2 bytes; writes O and the fp32 lse.
  EXPECT_EQ(attention.bytes_read, int64_t{32768} * 10 * 128 * 2);
  EXPECT_EQ(attention.bytes_written, int64_t{32768} * 8 * 128 * 2 + int64_t{32768} * 8 * 4);

  const LayerDag& b = dags.backward;
  EXPECT_EQ(window(b, "bwd.dout_a2a", "bwd.dqkv_a2a"),
            (Ids{"bwd.dout_a2a", "bwd.flash_attn", "bwd.dqkv_a2a"}));
  EXPECT_EQ(predecessors(b, "bwd.dout_a2a"), Ids{"bwd.proj_dgrad"});
  EXPECT_EQ(predecessors(b, "bwd.dqkv_a2a"), Ids{"bwd.flash_attn"});
  EXPECT_EQ(predecessors(b, "bwd.qkv_dgrad"), Ids{"bwd.dqkv_a2a"});
  EXPECT_EQ(op_of(b, "bwd.dout_a2a").comm_bytes, 67108864);
  EXPECT_EQ(op_of(b, "bwd.dqkv_a2a").comm_bytes, 83886080);

  // The attention does the ring's work: 8 heads · 32768² against 4 steps of 32 · 8192².
  const LayerDags ring = build_layer_dags(with_type(job, CpCommType::kP2p), 0);
  EXPECT_DOUBLE_EQ(total_attention_flops(f), total_attention_flops(ring.forward));
  EXPECT_DOUBLE_EQ(total_attention_flops(b), total_attention_flops(ring.backward));
}

TEST(CpCommType, UlyssesAcrossNodesIsACrossNodeAllToAll) {
  // A Llama-3-70B variant with 16 KV heads at tp 8, cp 2: 8 query and 2 KV heads a rank,
  // rank = tp + 8·cp, so rank 0's CP group is {0, 8}: two nodes.
  ModelSpec m = llama3_70b();
  m.num_kv_heads = 16;
  const JobSpec job =
      with_type(make_job(m, {.tp = 8, .cp = 2, .sp = true, .seq = 16384}), CpCommType::kA2a);
  const Op& qkv = op_of(build_layer_dags(job, 0).forward, "fwd.qkv_a2a");
  EXPECT_EQ(qkv.scope, GroupScope::kCrossNode);
  EXPECT_EQ(qkv.nodes_spanned, 2);
  EXPECT_EQ(qkv.stream, StreamClass::kCrossComm);
  // T = 8192; (8 + 2 + 2) · 128 · 2 bytes a token: 25,165,824.
  EXPECT_EQ(qkv.comm_bytes, 25165824);
}

TEST(CpCommType, AllGatherGathersKvWholeAndReduceScattersItsGradient) {
  // Llama-3-70B, tp 8, cp 4, 32k: 8 query and 1 KV head a rank; T = 8192.
  const JobSpec job = with_type(
      make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768}), CpCommType::kAllGather);
  const LayerDags dags = build_layer_dags(job, 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(window(f, "fwd.gemm_qkv", "fwd.gemm_proj"),
            (Ids{"fwd.gemm_qkv", "fwd.kv_allgather", "fwd.flash_attn", "fwd.gemm_proj"}));
  const Op& gather = op_of(f, "fwd.kv_allgather");
  EXPECT_EQ(gather.kind, OpKind::kAllGather);
  // The gathered K and V: 2 · 32768 · 128 · 2 bytes = 16,777,216 (cross-node: {0, 8, 16, 24}).
  EXPECT_EQ(gather.comm_bytes, 16777216);
  EXPECT_EQ(gather.scope, GroupScope::kCrossNode);
  const Op& attention = op_of(f, "fwd.flash_attn");
  EXPECT_EQ(attention.shape.heads, 8);
  EXPECT_EQ(attention.shape.q_len, 8192);
  EXPECT_EQ(attention.shape.kv_len, 32768);

  const LayerDag& b = dags.backward;
  EXPECT_EQ(predecessors(b, "bwd.kv_allgather"), Ids{"bwd.proj_dgrad"});
  EXPECT_EQ(predecessors(b, "bwd.flash_attn"), (Ids{"bwd.proj_dgrad", "bwd.kv_allgather"}));
  const Op& scatter = op_of(b, "bwd.dkv_reducescatter");
  EXPECT_EQ(scatter.kind, OpKind::kReduceScatter);
  EXPECT_EQ(scatter.comm_bytes, 16777216);
  EXPECT_EQ(predecessors(b, "bwd.qkv_dgrad"), (Ids{"bwd.flash_attn", "bwd.dkv_reducescatter"}));
  // Same work as the ring: 8192 queries against 32768 keys = 4 steps of 8192 x 8192.
  const LayerDags ring = build_layer_dags(with_type(job, CpCommType::kP2p), 0);
  EXPECT_DOUBLE_EQ(total_attention_flops(f), total_attention_flops(ring.forward));
}

TEST(CpCommType, HierarchicalRunsTheRingAcrossSubGroupsOnTheAllToAllsHeads) {
  // Llama-3-70B, tp 4, cp 4, [2, 2], 32k: T = 8192; 16 query and 2 KV heads a TP rank.
  // Rank 0: a2a group {0, 4} (node 0), ring {0, 8} (nodes 0 and 1).
  const JobSpec job =
      with_type(make_job(llama3_70b(), {.tp = 4, .cp = 4, .sp = true, .seq = 32768}),
                CpCommType::kA2aP2p, {2, 2});
  const LayerDags dags = build_layer_dags(job, 0);
  const LayerDag& f = dags.forward;
  EXPECT_EQ(window(f, "fwd.gemm_qkv", "fwd.gemm_proj"),
            (Ids{"fwd.gemm_qkv", "fwd.qkv_a2a", "fwd.kv_sendrecv0", "fwd.attn_step0",
                 "fwd.attn_step1", "fwd.attn_merge", "fwd.out_a2a", "fwd.gemm_proj"}));
  const Op& a2a = op_of(f, "fwd.qkv_a2a");
  EXPECT_EQ(a2a.group_size, 2);
  EXPECT_EQ(a2a.scope, GroupScope::kLocal);
  // 8192 · (16 + 2 + 2) · 128 · 2 = 41,943,040.
  EXPECT_EQ(a2a.comm_bytes, 41943040);
  const Op& hop = op_of(f, "fwd.kv_sendrecv0");
  EXPECT_EQ(hop.group_size, 2);
  EXPECT_EQ(hop.scope, GroupScope::kCrossNode);
  EXPECT_EQ(hop.nodes_spanned, 2);
  // K and V of 2·8192 tokens on 2/2 = 1 KV head: 2 · 16384 · 128 · 2 = 8,388,608.
  EXPECT_EQ(hop.comm_bytes, 8388608);
  const Op& step = op_of(f, "fwd.attn_step1");
  EXPECT_EQ(step.shape.heads, 8);
  EXPECT_EQ(step.shape.kv_heads, 1);
  EXPECT_EQ(step.shape.q_len, 16384);
  EXPECT_EQ(op_of(f, "fwd.attn_merge").shape.batch, 2);

  const LayerDag& b = dags.backward;
  EXPECT_EQ(window(b, "bwd.dout_a2a", "bwd.dqkv_a2a"),
            (Ids{"bwd.dout_a2a", "bwd.kv_sendrecv0", "bwd.attn_step0", "bwd.kv_sendrecv1",
                 "bwd.attn_step1", "bwd.kv_sendrecv2", "bwd.dqkv_a2a"}));
  // Ring of two: KV out, dKV back with the second step's block, dKV home: one block each.
  for (const char* id : {"bwd.kv_sendrecv0", "bwd.kv_sendrecv1", "bwd.kv_sendrecv2"})
    EXPECT_EQ(op_of(b, id).comm_bytes, 8388608) << id;
  EXPECT_EQ(predecessors(b, "bwd.dqkv_a2a"), (Ids{"bwd.attn_step1", "bwd.kv_sendrecv2"}));
  const LayerDags ring = build_layer_dags(with_type(job, CpCommType::kP2p), 0);
  EXPECT_DOUBLE_EQ(total_attention_flops(f), total_attention_flops(ring.forward));
  EXPECT_DOUBLE_EQ(total_attention_flops(b), total_attention_flops(ring.backward));
}

}  // namespace
}  // namespace dhelix
