#include "planner/plan_builder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "lib/error.h"
#include "lib/plan/plan_writer.h"
#include "planner/co_run_model.h"
#include "planner/layer_baselines.h"
#include "planner/layer_costs.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

// A tiny Llama-like model, tp 2 with SP, one stage, four micro-batches of 128 tokens.
JobSpec tiny_job() {
  JobSpec job;
  job.name = "tiny";
  job.source_file = "tiny.json";
  ModelSpec& m = job.model;
  m.name = "tiny-llama";
  m.hidden_size = 256;
  m.ffn_hidden_size = 512;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.head_dim = 64;
  m.vocab_size = 1000;
  m.max_seq_length = 128;
  job.cluster.name = "test-cluster";
  job.cluster.gpus_per_node = 8;
  job.cluster.gpu.name = "TestGPU";
  job.cluster.gpu.peak_bf16_tflops = 100;
  job.cluster.gpu.memory_bytes = int64_t{80} << 30;
  ParallelSpec& p = job.parallel;
  p.tp = 2;
  p.sp = true;
  p.seq_length = 128;
  p.micro_batch_size = 1;
  p.global_batch_size = 4;
  return job;
}

// Every op the planner looks up: compute ops 10 us, communication ops 1 us, and every pair
// with a communication op at its solo times (no slowdown). `skip` leaves one signature out;
// `keep_pair(a, b)` false leaves the pair of those signatures out.
Profile hand_profile(
    const JobSpec& job, const std::string& skip = "",
    const std::function<bool(const std::string&, const std::string&)>& keep_pair = nullptr) {
  Profile profile;
  std::vector<Op> distinct;
  const auto add = [&](const LayerDags& dags) {
    for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
      for (int64_t i = 0; i < dag->size(); ++i) {
        const Op& op = dag->op(i);
        if (op.signature() == skip || profile.find_op(op.signature()) != nullptr) continue;
        const double time_us = is_communication(op.kind) ? 1.0 : 10.0;
        profile.add_op({.signature = op.signature(),
                        .kind = op.kind,
                        .stream = op.stream,
                        .example_op_id = op.id,
                        .time_us = TimeStats::exactly(time_us),
                        .samples = 1});
        distinct.push_back(op);
      }
    }
  };
  add(build_layer_dags(job, 0));
  add(build_stage_extras(job, 0, true, true));
  add(build_intra_batch_layer_dags(job, 0));
  for (size_t i = 0; i < distinct.size(); ++i) {
    for (size_t j = i; j < distinct.size(); ++j) {
      const Op& a = distinct[i];
      const Op& b = distinct[j];
      if (!is_communication(a.kind) && !is_communication(b.kind)) continue;
      if (keep_pair && !keep_pair(a.signature(), b.signature())) continue;
      profile.add_pair({.a = a.signature(),
                        .b = b.signature(),
                        .finish_a_us = profile.find_op(a.signature())->time_us.median_us,
                        .finish_b_us = profile.find_op(b.signature())->time_us.median_us});
    }
  }
  return profile;
}

PlanRequest request_for(const JobSpec& job, const Profile& profile) {
  PlanRequest request;
  request.job = &job;
  request.profile = &profile;
  request.profile_name = "hand.json";
  request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  request.unprofiled_op_time_us = [](const Op&) { return 0.0; };
  return request;
}

int64_t compute_ops(const LayerDag& dag) {
  int64_t n = 0;
  for (int64_t i = 0; i < dag.size(); ++i) n += is_communication(dag.op(i).kind) ? 0 : 1;
  return n;
}

// With 1 us collectives beside 10 us kernels, co-running a forward with a backward can put
// every collective beside a kernel of the other strand: the optimum of a layer pair is the
// compute stream's work, 10 us per compute op, and no TP time stays exposed in SI blocks.
// What stays exposed is the one micro-batch that runs alone at each end of the W (the
// forward of micro-batch 0, the backward of micro-batch 3): exactly a quarter of what
// Megatron exposes running all four alone. Per layer the forward exposes its four
// collectives (all-gather, reduce-scatter around attention and MLP: 4 us) and the
// backward one (1 us; the others run beside weight-gradient GEMMs): 2 x (4 + 1) = 10 us.
TEST(PlanBuilder, DhelixHidesAllTpCommunicationOfTheTinyJob) {
  const JobSpec job = tiny_job();
  const Profile profile = hand_profile(job);
  const PlanResult result = build_plan(request_for(job, profile));
  const LayerDags dags = build_layer_dags(job, 0);
  const int64_t compute = compute_ops(dags.forward) + compute_ops(dags.backward);
  ASSERT_EQ(result.plan.pairings.size(), 1u);
  const PlanPairing& pairing = result.plan.pairings[0];
  EXPECT_DOUBLE_EQ(pairing.layer_pair_us, 10.0 * static_cast<double>(compute));
  EXPECT_EQ(pairing.chunk_layers, 1);  // 2 layers folded over 1 stage: chunks of 1
  const PlanScheme* dhelix = result.plan.find_scheme(PipelineScheme::kDHelix);
  const PlanScheme* megatron = result.plan.find_scheme(PipelineScheme::kMegatron1F1B);
  ASSERT_NE(dhelix, nullptr);
  ASSERT_NE(megatron, nullptr);
  EXPECT_EQ(dhelix->comm[0].type, ParallelDim::kTp);
  EXPECT_DOUBLE_EQ(dhelix->comm[0].exposed_us, 10.0);
  EXPECT_DOUBLE_EQ(megatron->comm[0].exposed_us, 4 * 10.0);
  EXPECT_GT(dhelix->comm[0].hidden_us, 0.0);
  EXPECT_EQ(dags.forward.size() - compute_ops(dags.forward), 4);
  EXPECT_LT(dhelix->iteration_us, megatron->iteration_us);
  EXPECT_EQ(result.plan.num_micro_batches, 4);
  ASSERT_EQ(result.plan.stages.size(), 1u);
  const PlanStage& stage = result.plan.stages[0];
  EXPECT_TRUE(stage.embedding);
  EXPECT_TRUE(stage.head_loss);
  EXPECT_EQ(stage.down_layers.first, 0);
  EXPECT_EQ(stage.up_layers.first, 1);
  // W on one stage, m = 4: F0d F0u H0 F1d F1u H1 ... SI blocks pair F(j) with B(j-1).
  ASSERT_FALSE(stage.tasks.empty());
  EXPECT_EQ(stage.tasks[0].label, "F0d");
  EXPECT_DOUBLE_EQ(stage.tasks[0].start_us, 0.0);
  EXPECT_TRUE(stage.tasks[0].waits_for.empty());  // one stage: no p2p
}

TEST(PlanBuilder, SamePlanTwiceGivesIdenticalText) {
  const JobSpec job = tiny_job();
  const Profile profile = hand_profile(job);
  const std::string first = plan_to_text(build_plan(request_for(job, profile)).plan);
  const std::string second = plan_to_text(build_plan(request_for(job, profile)).plan);
  EXPECT_EQ(first, second);
}

// The fix names a new file: `-o hand.json` would overwrite a profile right for another job.
const std::string kReprofileHint =
    "\nhand.json was probably made for another job: profile this job into a new file "
    "(`dhelix-profile JOB -o JOB-profile.json`, then --profile JOB-profile.json), or plan "
    "without --profile";

TEST(PlanBuilder, MissingProfileOpsAreNamed) {
  const JobSpec job = tiny_job();
  const std::string missing = build_layer_dags(job, 0).forward.op(0).signature();
  const Profile profile = hand_profile(job, missing);
  try {
    build_plan(request_for(job, profile));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_EQ(std::string(error.what()),
              "hand.json: lacks 1 op signature the job needs:\n  " + missing + kReprofileHint);
  }
}

std::string plan_error(const JobSpec& job, const Profile& profile) {
  try {
    build_plan(request_for(job, profile));
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  return "no error";
}

// Without a pair the co-run model assumes no slowdown: an optimistic plan. So a profile
// without a pair the job may co-run is refused like one without an op.
TEST(PlanBuilder, MissingProfilePairsAreNamed) {
  const JobSpec job = tiny_job();
  const Op all_gather = build_layer_dags(job, 0).forward.op(1);
  ASSERT_EQ(all_gather.kind, OpKind::kAllGather);
  const std::string ag = all_gather.signature();
  // Only the all-gather against itself (the two strands' copies) is missing.
  Profile profile = hand_profile(
      job, "", [&](const std::string& a, const std::string& b) { return !(a == ag && b == ag); });
  EXPECT_EQ(plan_error(job, profile),
            "hand.json: lacks 1 co-run pair the job needs (the planner would assume they do not "
            "slow each other):\n  " +
                ag + " x " + ag + kReprofileHint);
  // 33 compute and 4 communication signatures (all-gather, reduce-scatter, the fp32
  // gradient all-reduce, the head's send/recv): 33·4 + 4·5/2 = 142 pairs, all missing
  // without pairs; the first 5 in first-seen order are named.
  const Profile full = hand_profile(job);
  int64_t comm = 0;
  for (const ProfiledOp& op : full.ops()) comm += is_communication(op.kind) ? 1 : 0;
  ASSERT_EQ(comm, 4);
  ASSERT_EQ(full.ops().size(), 37u);
  EXPECT_EQ(full.pairs().size(), 142u);
  profile = hand_profile(job, "", [](const std::string&, const std::string&) { return false; });
  const std::string norm = "norm.fwd:bf16:rmsnorm:m=64,n=256";
  EXPECT_EQ(plan_error(job, profile),
            "hand.json: lacks 142 co-run pairs the job needs (the planner would assume they do "
            "not slow each other):\n  " +
                norm + " x " + ag + "\n  " + norm +
                " x reduce_scatter:bf16:bytes=65536:tp2:local\n  " + norm +
                " x all_reduce:fp32:bytes=1536:tp2:local\n  " + norm +
                " x send_recv:bf16:bytes=32768:tp2:local\n  " + ag + " x " + ag +
                "\n  ... and 137 more" + kReprofileHint);
}

TEST(PlanBuilder, SoloTimesMustBeFiniteAndNonNegative) {
  const LayerDag dag = build_layer_dags(tiny_job(), 0).forward;
  const std::string id = dag.op(dag.topological_order().front()).id;
  const TableCoRunModel co_run(1.0);
  for (const double bad : {std::numeric_limits<double>::infinity(), std::nan(""), -1.0}) {
    const auto solo = [bad](const Op&) { return bad; };
    const std::string text = fmt::format("{}", bad);
    const std::string expected =
        "op " + id + ": solo time " + text + " us must be finite and non-negative";
    try {
      from_layer_dag(dag, solo);
      ADD_FAILURE() << "from_layer_dag accepted " << text;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()), expected);
    }
    try {
      single_strand_schedule(dag, solo, co_run, Strand::kForward);
      ADD_FAILURE() << "single_strand_schedule accepted " << text;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()), expected);
    }
  }
}

TEST(PlanBuilder, PlanThatDoesNotFitIsRefusedUnlessAllowed) {
  JobSpec job = tiny_job();
  job.cluster.gpu.memory_bytes = int64_t{1} << 30;  // less than the 2 GiB fixed reserve
  const Profile profile = hand_profile(job);
  try {
    build_plan(request_for(job, profile));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInfeasible);
    // Below the reserve no stage can fit: the budget says so (no "-0.95 GiB are usable").
    EXPECT_NE(std::string(error.what())
                  .find("cluster preset test-cluster: gpu.memory_bytes: 1073741824 bytes (1.00 "
                        "GiB) is no more than the memory every plan keeps free on a GPU"),
              std::string::npos)
        << error.what();
  }
  job.cluster.gpu.memory_bytes = 2261604041;  // (2 GiB + 1 MiB) / 0.95: 1 MiB usable
  try {
    build_plan(request_for(job, profile));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInfeasible);
    EXPECT_NE(std::string(error.what()).find("dhelix: stage 0 needs"), std::string::npos)
        << error.what();
  }
  job.cluster.gpu.memory_bytes = int64_t{1} << 30;
  PlanRequest request = request_for(job, profile);
  request.allow_oom = true;
  const PlanResult result = build_plan(request);
  ASSERT_FALSE(result.warnings.empty());
  EXPECT_NE(result.warnings[0].find("(--allow-oom: the plan is written anyway)"),
            std::string::npos);
  EXPECT_FALSE(result.plan.find_scheme(PipelineScheme::kDHelix)->fits);
  EXPECT_TRUE(result.plan.options.allow_oom);
}

// Two stages: stage 0 keeps layers 0 and 3 with embedding, head and loss, stage 1 layers 1
// and 2. Stage 1's first task, F0d, waits for stage 0's F0d (its first task): one p2p.
TEST(PlanBuilder, TwoStagesListRanksLayersAndP2pWaits) {
  JobSpec job = tiny_job();
  job.model.num_layers = 4;
  job.parallel.pp = 2;
  const Profile profile = hand_profile(job);
  const PlanResult result = build_plan(request_for(job, profile));
  ASSERT_EQ(result.plan.stages.size(), 2u);
  const PlanStage& s0 = result.plan.stages[0];
  const PlanStage& s1 = result.plan.stages[1];
  EXPECT_EQ(s0.ranks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s1.ranks, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s1.shape_rank, 2);
  EXPECT_EQ(s0.up_layers.first, 3);
  EXPECT_EQ(s1.down_layers.first, 1);
  EXPECT_EQ(s1.up_layers.first, 2);
  EXPECT_TRUE(s0.embedding && s0.head_loss);
  EXPECT_FALSE(s1.embedding || s1.head_loss);
  EXPECT_EQ(result.plan.pairings.size(), 1u);  // both stages have the same layer shapes
  EXPECT_EQ(s1.pairing, 0);
  ASSERT_EQ(s1.tasks[0].label, "F0d");
  ASSERT_EQ(s1.tasks[0].waits_for.size(), 1u);
  EXPECT_EQ(s1.tasks[0].waits_for[0].stage, 0);
  EXPECT_EQ(s1.tasks[0].waits_for[0].task, 0);
  EXPECT_GE(s1.tasks[0].start_us, s0.tasks[0].end_us);
}

// A 40 us all-gather beside a 30 us GEMM started with it: 30 us hidden, 10 exposed. A
// second all-gather alone afterwards: 5 us exposed.
TEST(PlanBuilder, HiddenIsTheCommunicationTimeBesideAKernel) {
  StrandKinds forward{
      .stream = {StreamClass::kCompute}, .group = {ParallelDim::kTp}, .solo_us = {}};
  StrandKinds backward{
      .stream = {StreamClass::kLocalComm}, .group = {ParallelDim::kTp}, .solo_us = {}};
  PairingBlock block;
  block.simulation.ops = {{.strand = Strand::kBackward, .op = 0, .start_us = 0, .finish_us = 40},
                          {.strand = Strand::kForward, .op = 0, .start_us = 0, .finish_us = 30}};
  PairingBlock lone;
  lone.simulation.ops = {{.strand = Strand::kBackward, .op = 1, .start_us = 0, .finish_us = 5}};
  backward.stream.push_back(StreamClass::kCrossComm);
  backward.group.push_back(ParallelDim::kCp);
  const CommBreakdown comm = blocks_comm({block, lone}, forward, backward);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].hidden_us, 30);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].exposed_us, 10);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].exposed_us, 5);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].hidden_us, 0);
}

// A GEMM of 30 us solo slowed to 36 us beside a 40 us all-gather started with it: the
// all-gather ran 36 us beside a kernel, but 6 of them are the GEMM's slowdown, which the
// collective caused: 30 us hidden, 4 + 6 = 10 exposed (the block lasts 40 us, the GEMM
// alone 30).
TEST(PlanBuilder, SlowdownBesideACollectiveIsExposedCommunication) {
  StrandKinds forward{
      .stream = {StreamClass::kCompute}, .group = {ParallelDim::kTp}, .solo_us = {30}};
  StrandKinds backward{
      .stream = {StreamClass::kLocalComm}, .group = {ParallelDim::kTp}, .solo_us = {40}};
  PairingBlock block;
  block.simulation.ops = {{.strand = Strand::kBackward, .op = 0, .start_us = 0, .finish_us = 40},
                          {.strand = Strand::kForward, .op = 0, .start_us = 0, .finish_us = 36}};
  const CommBreakdown comm = blocks_comm({block}, forward, backward);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].hidden_us, 30);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].exposed_us, 10);
}

// Two collectives beside one slowed GEMM share its slowdown by their overlap: a TP
// all-gather over [0, 40] and a CP send over [0, 20] beside a GEMM of 48 us solo that runs
// [0, 60]: 12 us of slowdown, overlaps 40 and 20, so TP takes 8 and CP 4. TP: 40 beside,
// 32 hidden, 8 exposed; CP: 20 beside, 16 hidden, 4 exposed.
TEST(PlanBuilder, SlowdownIsSplitByOverlap) {
  StrandKinds forward{
      .stream = {StreamClass::kCompute}, .group = {ParallelDim::kTp}, .solo_us = {48}};
  StrandKinds backward{.stream = {StreamClass::kLocalComm, StreamClass::kCrossComm},
                       .group = {ParallelDim::kTp, ParallelDim::kCp},
                       .solo_us = {40, 20}};
  PairingBlock block;
  block.simulation.ops = {{.strand = Strand::kBackward, .op = 0, .start_us = 0, .finish_us = 40},
                          {.strand = Strand::kBackward, .op = 1, .start_us = 0, .finish_us = 20},
                          {.strand = Strand::kForward, .op = 0, .start_us = 0, .finish_us = 60}};
  const CommBreakdown comm = blocks_comm({block}, forward, backward);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].hidden_us, 32);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].exposed_us, 8);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].hidden_us, 16);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].exposed_us, 4);
}

// A paired block whose ops start 20 us after its barrier (planner/block_launch.h): the 20 us
// are exposed communication of its collectives, by their time: a 40 us all-gather and a
// 10 us send, both beside a 50 us GEMM (no slowdown): TP 40 hidden, 16 exposed; CP 10
// hidden, 4 exposed.
TEST(PlanBuilder, LaunchIntervalIsExposedCommunication) {
  StrandKinds forward{
      .stream = {StreamClass::kCompute}, .group = {ParallelDim::kTp}, .solo_us = {50}};
  StrandKinds backward{.stream = {StreamClass::kLocalComm, StreamClass::kCrossComm},
                       .group = {ParallelDim::kTp, ParallelDim::kCp},
                       .solo_us = {40, 10}};
  PairingBlock block;
  block.simulation.ops = {{.strand = Strand::kBackward, .op = 0, .start_us = 20, .finish_us = 60},
                          {.strand = Strand::kBackward, .op = 1, .start_us = 20, .finish_us = 30},
                          {.strand = Strand::kForward, .op = 0, .start_us = 20, .finish_us = 70}};
  const CommBreakdown comm = blocks_comm({block}, forward, backward);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].hidden_us, 40);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kTp].exposed_us, 16);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].hidden_us, 10);
  EXPECT_DOUBLE_EQ(comm[ParallelDim::kCp].exposed_us, 4);
}

TEST(PlanBuilder, OptimizerStepMovesThirtyBytesPerParameter) {
  GpuSpec gpu;
  gpu.memory_bandwidth_gbps = 1000;                           // 1e6 bytes per us
  gpu.memory_efficiency = 0.5;                                // 5e5 usable
  EXPECT_DOUBLE_EQ(optimizer_step_us(gpu, 1'000'000), 60.0);  // 3e7 bytes / 5e5
}

}  // namespace
}  // namespace dhelix
