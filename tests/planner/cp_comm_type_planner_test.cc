// --cp-comm-type in the planner: the model backend's prices of the new CP collectives and
// the memory model's head-split activations against hand arithmetic, the exact pairing
// search on a DAG holding Ulysses' all-to-alls (equal to the brute force, and hiding them
// under the other strand's compute with no code of its own), and Megatron's baseline running
// them exposed (planner/layer_costs.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "planner/brute_force_pairing.h"
#include "planner/co_run_model.h"
#include "planner/layer_costs.h"
#include "planner/memory_model.h"
#include "planner/pairing_search.h"
#include "planner/profile_co_run.h"
#include "profiler/collective_cost.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/lib/dag_test_jobs.h"
#include "tests/planner/dag_window.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

JobSpec with_type(JobSpec job, CpCommType type, std::vector<int64_t> sizes = {}) {
  job.parallel.cp_comm_type = type;
  job.parallel.hierarchical_cp_sizes = std::move(sizes);
  return job;
}

const Op& op_of(const LayerDag& dag, const std::string& id) {
  const auto index = dag.find(id);
  EXPECT_TRUE(index.has_value()) << id;
  return dag.op(index.value_or(0));
}

// ---------------------------------------------------------------- prices

TEST(CpCommTypeCost, UlyssesAllToAllIsPricedLikeMoesOnTheNvLink) {
  // Llama-3-70B tp 2 cp 4 32k: fwd.qkv_a2a moves S = 83,886,080 bytes over a local group of
  // 4 (B = 232 GB/s = 232,000 bytes/us, alpha = 9 us on the A100-like cluster):
  //   t = 3 · 9 + 3/4 · 83,886,080 / 232,000 = 27 + 271.18345 = 298.18345 us.
  const JobSpec job = with_type(
      make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768}), CpCommType::kA2a);
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.qkv_a2a")), 298.18345, 1e-4);
  // fwd.out_a2a: 27 + 3/4 · 67,108,864 / 232,000 = 27 + 216.94676 = 243.94676 us.
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.out_a2a")), 243.94676, 1e-4);
}

TEST(CpCommTypeCost, CrossNodeAllToAllGetsOneNicPerGpu) {
  // 16 KV heads, tp 8, cp 2: CP group {0, 8} over two nodes, S = 25,165,824 bytes. An
  // all-to-all leaving the node gets one NIC's share per GPU: 4 NICs x 24 GB/s / 8 GPUs =
  // 12 GB/s; alpha = max(5, 9) = 9 us: t = 9 + 1/2 · 25,165,824 / 12,000 = 1057.576 us.
  ModelSpec m = llama3_70b();
  m.num_kv_heads = 16;
  const JobSpec job =
      with_type(make_job(m, {.tp = 8, .cp = 2, .sp = true, .seq = 16384}), CpCommType::kA2a);
  const Op& a2a = op_of(build_layer_dags(job, 0).forward, "fwd.qkv_a2a");
  EXPECT_NEAR(collective_time_us(test::a100_like_cluster(), a2a), 1057.576, 1e-6);
}

TEST(CpCommTypeCost, AllGatherAndReduceScatterOfKvOverTheRails) {
  // tp 8, cp 4, 32k: CP group {0, 8, 16, 24}, one member a node: 4 · 24 · 1/8 = 12 GB/s.
  // K and V gathered: S = 16,777,216: t = 3 · 9 + 3/4 · S / 12,000 = 27 + 1048.576 us; the
  // backward's reduce-scatter of dK, dV is the same size and price.
  const JobSpec job = with_type(
      make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768}), CpCommType::kAllGather);
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.kv_allgather")), 1075.576, 1e-6);
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.backward, "bwd.dkv_reducescatter")), 1075.576,
              1e-6);
}

TEST(CpCommTypeCost, HierarchicalPricesItsA2aOnTheNodeAndItsRingOnTheNetwork) {
  // tp 4, cp 4, [2, 2]: a2a over {0, 4} (local, n = 2): S = 41,943,040,
  //   t = 9 + 1/2 · 41,943,040 / 232,000 = 9 + 90.39448 = 99.39448 us;
  // ring hop over {0, 8} (2 nodes, m = 1: 12 GB/s): S = 8,388,608,
  //   t = 9 + 8,388,608 / 12,000 = 9 + 699.05067 = 708.05067 us.
  const JobSpec job =
      with_type(make_job(llama3_70b(), {.tp = 4, .cp = 4, .sp = true, .seq = 32768}),
                CpCommType::kA2aP2p, {2, 2});
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.qkv_a2a")), 99.39448, 1e-4);
  EXPECT_NEAR(collective_time_us(cluster, op_of(dags.forward, "fwd.kv_sendrecv0")), 708.05067,
              1e-4);
}

// ---------------------------------------------------------------- memory

TEST(CpCommTypeMemory, UlyssesKeepsTheHeadSplitOutputBesidesTheProjectionInput) {
  // Llama-3-70B tp 2 cp 4 32k: 8192 tokens a rank, q = 64 · 128 = 8192 columns over tp 2,
  // bf16: one more output tensor = 8192 · 8192 · 2 / 2 = 67,108,864 bytes a layer.
  const JobSpec job = make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768});
  const MemoryOptions options;
  const int64_t ring = layer_activation_bytes(job.model, job.parallel, options);
  const JobSpec a2a = with_type(job, CpCommType::kA2a);
  EXPECT_EQ(layer_activation_bytes(a2a.model, a2a.parallel, options) - ring, 67108864);
  const JobSpec hierarchical = with_type(job, CpCommType::kA2aP2p, {2, 2});
  EXPECT_EQ(layer_activation_bytes(hierarchical.model, hierarchical.parallel, options) - ring,
            67108864);
  // The all-gather keeps only the local K and V (TE gathers them again in the backward).
  const JobSpec gather = with_type(job, CpCommType::kAllGather);
  EXPECT_EQ(layer_activation_bytes(gather.model, gather.parallel, options), ring);
}

// ---------------------------------------------------------------- pairing

TEST(CpCommTypePairing, ExactSearchPairsUlyssesAllToAllsWithTheOtherStrandsCompute) {
  // Llama-3-70B tp 2 cp 4 32k on H100-like figures of the model backend: the forward from
  // the QKV GEMM to the projection (qkv_a2a, flash_attn, out_a2a inside) against the
  // backward from proj_dgrad to the QKV weight gradient (dout_a2a, the attention backward,
  // dqkv_a2a inside).
  const JobSpec job = with_type(
      make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768}), CpCommType::kA2a);
  const LayerDags dags = build_layer_dags(job, 0);
  const ClusterSpec cluster = test::a100_like_cluster();
  const StrandGraph f = testing::dag_window(dags.forward, "fwd.gemm_qkv", "fwd.gemm_proj", cluster);
  const StrandGraph b =
      testing::dag_window(dags.backward, "bwd.proj_dgrad", "bwd.qkv_dgrad", cluster);
  ASSERT_GE(f.find("fwd.qkv_a2a"), 0);
  ASSERT_GE(b.find("bwd.dqkv_a2a"), 0);
  TableCoRunModel rates(0.9);  // every pair slows both by 10 %
  const BlockCostModel model(f, b, rates);
  const PairingResult dp = search_pairing(model, {});
  const BruteForceResult brute = brute_force_pairing(model, 0);
  EXPECT_NEAR(dp.total_time_us, brute.total_time_us, 1e-9 * brute.total_time_us);
  EXPECT_NEAR(resimulate_total_us(model, dp.blocks), dp.total_time_us, 1e-9 * dp.total_time_us);
  // The all-to-alls are hidden in part: the pair beats the strands one after the other.
  EXPECT_LT(dp.total_time_us, dp.sequential_time_us - 100);
  bool a2a_beside_compute = false;
  for (const PairingBlock& block : dp.blocks) {
    for (const OpTiming& x : block.simulation.ops) {
      const StrandGraph& gx = x.strand == Strand::kForward ? f : b;
      if (gx.op(x.op).id.find("_a2a") == std::string::npos) continue;
      for (const OpTiming& y : block.simulation.ops) {
        const StrandGraph& gy = y.strand == Strand::kForward ? f : b;
        if (y.strand != x.strand && gy.op(y.op).stream == StreamClass::kCompute &&
            y.start_us < x.finish_us && x.start_us < y.finish_us)
          a2a_beside_compute = true;
      }
    }
  }
  EXPECT_TRUE(a2a_beside_compute);
}

// ---------------------------------------------------------------- Megatron's baseline

TEST(CpCommTypeBaseline, MegatronRunsTheAllToAllsExposedDhelixHidesThem) {
  // Llama-3-70B with 8 layers, tp 2 cp 4 32k, the model backend's profile of the job.
  JobSpec job = with_type(make_job(llama3_70b(), {.tp = 2, .cp = 4, .sp = true, .seq = 32768}),
                          CpCommType::kA2a);
  job.model.num_layers = 8;
  job.cluster = test::a100_like_cluster();
  const Profile profile = make_model_profile(job, OrderedJson::object());
  const PairTimesCoRunModel co_run = profile_co_run_model(profile);
  const LayerAnalysis a = analyze_layers(job, 0, profile, co_run, 1, 8);
  // Megatron: every CP all-to-all exposed, in the forward and in the backward.
  EXPECT_GT(a.megatron.forward_comm[ParallelDim::kCp].exposed_us, 0);
  EXPECT_DOUBLE_EQ(a.megatron.forward_comm[ParallelDim::kCp].hidden_us, 0);
  EXPECT_DOUBLE_EQ(a.megatron.backward_comm[ParallelDim::kCp].hidden_us, 0);
  // Its strands alone are no faster than DHelix's own single-strand schedules.
  EXPECT_GE(a.megatron.backward_us, a.dhelix_layer.backward_us);
  // DHelix's pair hides some of the CP all-to-alls.
  EXPECT_GT(a.dhelix_layer.si_pair_comm[ParallelDim::kCp].hidden_us, 0);
  EXPECT_LT(a.dhelix_layer.si_pair_us, a.megatron.forward_us + a.megatron.backward_us);
}

}  // namespace
}  // namespace dhelix
