// All-gather CP's whole-sequence K/V and dK/dV in flight (planner/memory_model.h,
// TransformerEngine's AttnFuncWithCPAndKVAllGather) against hand arithmetic, in the model
// and in the simulated peak.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "planner/memory_model.h"
#include "planner/pipeline_schedule.h"
#include "planner/pipeline_simulator.h"
#include "planner/scheme_memory.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::llama3_70b;
using testing::make_job;

JobSpec cp_job(CpCommType type) {
  JobSpec job = make_job(llama3_70b(), {.tp = 8, .cp = 4, .sp = true, .seq = 32768});
  job.parallel.cp_comm_type = type;
  if (type == CpCommType::kA2aP2p) job.parallel.hierarchical_cp_sizes = {2, 2};
  return job;
}

// Llama-3-70B's 64 query and 8 KV heads leave 8 and 1 per TP rank: a2a needs heads the CP
// group splits, so its jobs take 32 KV heads (4 per TP rank).
JobSpec a2a_job(CpCommType type) {
  JobSpec job = cp_job(type);
  job.model.num_kv_heads = 32;
  return job;
}

// ---------------------------------------------------------------- memory in flight

TEST(CpAllGatherMemory, AllGatherHoldsTheWholeSequencesKvHandWorked) {
  // Llama-3-70B, tp 8 (1 of 8 KV heads per rank, d = 128), cp 4, S = 32,768, b = 1, bf16:
  //   G = dt·b·S·2·kv_width = 2·1·32,768·2·128 = 16,777,216 bytes (the all-gather's size);
  //   forward G, backward 2G (K, V gathered again and dK, dV of the whole sequence).
  const JobSpec job = cp_job(CpCommType::kAllGather);
  EXPECT_EQ(cp_gathered_kv_bytes(job.model, job.parallel), 16'777'216);
  EXPECT_EQ(cp_forward_transient_bytes(job.model, job.parallel), 16'777'216);
  EXPECT_EQ(cp_backward_transient_bytes(job.model, job.parallel), 33'554'432);
  // Same size as the DAG's all-gather.
  const LayerDags dags = build_layer_dags(job, 0);
  EXPECT_EQ(dags.forward.op(*dags.forward.find("fwd.kv_allgather")).comm_bytes, 16'777'216);
  // Nothing for the ring, the all-to-alls, or without CP.
  for (CpCommType type : {CpCommType::kP2p, CpCommType::kA2a, CpCommType::kA2aP2p}) {
    const JobSpec other = a2a_job(type);
    EXPECT_EQ(cp_gathered_kv_bytes(other.model, other.parallel), 0);
    EXPECT_EQ(cp_backward_transient_bytes(other.model, other.parallel), 0);
  }
  JobSpec no_cp = make_job(llama3_70b(), {.tp = 8, .sp = true, .seq = 32768});
  no_cp.parallel.cp_comm_type = CpCommType::kAllGather;
  EXPECT_EQ(cp_gathered_kv_bytes(no_cp.model, no_cp.parallel), 0);
}

TEST(CpAllGatherMemory, TheSimulatedPeakCarriesTheGatheredKv) {
  // Megatron's 1F1B (no SI blocks), stage 0 of pp 2 (no head): the peak is a backward's
  // start, 2G above the ring's (the same kept bytes: allgather keeps the local K, V as the
  // ring does).
  JobSpec ring = cp_job(CpCommType::kP2p);
  ring.parallel.pp = 2;
  JobSpec gather = ring;
  gather.parallel.cp_comm_type = CpCommType::kAllGather;
  const int64_t g = 16'777'216;
  EXPECT_EQ(layer_activation_bytes(gather.model, gather.parallel),
            layer_activation_bytes(ring.model, ring.parallel));
  EXPECT_EQ(scheme_memory(gather, PipelineScheme::kMegatron1F1B, {})[0].activation_bytes,
            scheme_memory(ring, PipelineScheme::kMegatron1F1B, {})[0].activation_bytes + 2 * g);
}

TEST(CpAllGatherMemory, SimulatorChargesTheForwardsAndBothStrandsInAnSiBlock) {
  // pp 1, m 1, a chunk keeping 5 bytes; 4 bytes in flight in the forward, 8 in the
  // backward: F0 (0-1) 5 + 4, then 5; H0 (1-2) 5 + 10, then 5; B0 (2-3) 5 + 8, then 0.
  StageCosts c;
  c.forward_chunk_us = 1;
  c.backward_chunk_us = 1;
  c.head_loss_forward_us = 0.5;
  c.head_loss_backward_us = 0.5;
  c.layers_per_chunk = 1;
  c.activation_bytes_per_layer = 5;
  c.forward_transient_bytes = 4;
  c.backward_transient_bytes = 8;
  c.head_loss_transient_bytes = 10;
  const PipelineSimulation sim = simulate_pipeline(make_one_f_one_b_schedule(1, 1), {c});
  std::string curve;
  for (const MemoryPoint& point : sim.stages[0].activation_curve) {
    curve +=
        std::to_string(static_cast<int>(point.time_us)) + ":" + std::to_string(point.bytes) + " ";
  }
  EXPECT_EQ(curve, "0:9 1:5 1:15 2:5 2:13 3:0 ");
  EXPECT_EQ(sim.stages[0].peak_activation_bytes, 15);
}

}  // namespace
}  // namespace dhelix
