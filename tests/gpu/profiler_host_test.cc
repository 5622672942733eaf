// Host-side logic of the cuda profiler backend (profiler/cuda/): device choice, node layout,
// NCCL set-up order, progress text, operand bytes and launch plans. Runs on machines without
// a GPU. Its statistics are profiler/sampling.h's: tests/profiler/sampling_test.cc.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/rank_shape.h"
#include "profiler/cuda/cuda_op_plan.h"
#include "profiler/cuda/cuda_setup.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_setup.h"

namespace dhelix::cuda_profile {
namespace {

std::string error_text(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

TEST(CudaSetup, WorldSizeIsEveryGpuOfTheJob) {
  const JobSpec job =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-tp2.json");
  EXPECT_NO_THROW(check_cuda_world_size(job, 2));
  EXPECT_EQ(error_text([&] { check_cuda_world_size(job, 1); }),
            "the cuda backend profiles on every GPU of the job (tp 2 x cp 1 x dp 1 x pp 1 = 2 "
            "ranks): run mpirun -np 2 dhelix-profile --backend cuda ... (this run has 1 rank)");
}

TEST(CudaSetup, NodeLayout) {
  EXPECT_EQ(node_layout_problem({"a", "a", "b", "b"}, 2), "");
  EXPECT_EQ(node_layout_problem({"a", "b", "a", "b"}, 2),
            "the job puts 2 ranks on each node, in blocks (node = rank / 2), but rank 1 is on "
            "host b but rank 0 on host a: start the ranks with mpirun --map-by ppr:2:node or "
            "srun --ntasks-per-node=2 --distribution=block");
  EXPECT_EQ(node_layout_problem({"a", "a", "a", "a"}, 2),
            "the job puts 2 ranks on each node, in blocks (node = rank / 2), but rank 2 is on "
            "host a with rank 1, which belongs to the previous node: start the ranks with "
            "mpirun --map-by ppr:2:node or srun --ntasks-per-node=2 --distribution=block");
}

TEST(CudaSetup, NcclGroupsFollowThePlacement) {
  // tp 2, dp 2, pp 2 on 4-GPU nodes: TP {0,1} {2,3} ..., DP {0,2} {1,3} ..., PP {0,4} ...
  ParallelSpec parallel;
  parallel.tp = 2;
  parallel.dp = 2;
  parallel.pp = 2;
  const Placement placement(parallel, 4);
  const std::vector<NcclGroupSetup> setups =
      nccl_group_setups(placement, {ParallelDim::kPp, ParallelDim::kTp, ParallelDim::kDp}, 5);
  ASSERT_EQ(setups.size(), 3u);
  EXPECT_EQ(setups[0].dim, ParallelDim::kPp);  // the order asked for
  EXPECT_EQ(setups[0].root, 1);                // {1, 5}
  EXPECT_EQ(setups[0].key, 1);
  EXPECT_EQ(setups[0].size, 2);
  EXPECT_EQ(setups[1].root, 4);  // TP {4, 5}
  EXPECT_EQ(setups[1].key, 1);
  EXPECT_EQ(setups[2].root, 5);  // DP {5, 7}
  EXPECT_EQ(setups[2].key, 0);
}

TEST(CudaSetup, NcclGroupsTakeTheRuntimesBlockLimit) {
  // Pipeline transfers run on communicators capped at the runtime's channel maxCTAs (a
  // receive kernel stays resident for the iteration); the profile must time them so
  // (before, it used NCCL's default channels). Every other group: NCCL's default, as the
  // runtime (tests/device/comm_warmup_test.cc checks the runtime's side).
  ParallelSpec parallel;
  parallel.tp = 2;
  parallel.dp = 2;
  parallel.pp = 2;
  const Placement placement(parallel, 4);
  for (const NcclGroupSetup& setup :
       nccl_group_setups(placement, {ParallelDim::kPp, ParallelDim::kTp, ParallelDim::kDp}, 5)) {
    EXPECT_EQ(setup.max_ctas, cuda::runtime_max_ctas(setup.dim)) << parallel_dim_name(setup.dim);
    const int64_t expected =
        setup.dim == ParallelDim::kPp ? cuda::DeviceCommSetup{}.channel_max_ctas : 0;
    EXPECT_EQ(setup.max_ctas, expected) << parallel_dim_name(setup.dim);
  }
}

TEST(CudaSetup, CommunicationDimsInFirstSeenOrder) {
  const JobSpec job =
      read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-tp2.json");
  EXPECT_EQ(communication_dims(collect_profile_space(job)),
            (std::vector<ParallelDim>{ParallelDim::kTp}));
}

TEST(CudaSetup, ProgressLineAndDurations) {
  EXPECT_EQ(progress_line(0, 4, 0, 8), "[........] 0/4, ? left");
  EXPECT_EQ(progress_line(1, 4, 10, 8), "[##......] 1/4, 0:30 left");
  EXPECT_EQ(progress_line(4, 4, 99, 8), "[########] 4/4, 0:00 left");
  EXPECT_EQ(format_duration(754), "12:34");
  EXPECT_EQ(format_duration(3723), "1:02:03");
}

TEST(CudaSetup, OperandBytesAreFiniteAndSmall) {
  const std::vector<unsigned char> bf16 = random_operand_bytes(DType::kBf16, 1000, 7);
  ASSERT_EQ(bf16.size(), 2000u);
  const std::vector<unsigned char> fp16 = random_operand_bytes(DType::kFp16, 1000, 7);
  const std::vector<unsigned char> fp32 = random_operand_bytes(DType::kFp32, 1000, 7);
  for (size_t i = 0; i < 1000; ++i) {
    // bf16 -> float: the high half of the float's bits.
    const uint32_t bits = (uint32_t{bf16[2 * i]} | uint32_t{bf16[2 * i + 1]} << 8) << 16;
    float value = 0;
    std::memcpy(&value, &bits, sizeof value);
    EXPECT_TRUE(std::abs(value) >= 1.0f / 32 && std::abs(value) < 1.0f) << value;
    // fp16: exponent field 10..14 (2^-5 .. 2^-1).
    const uint32_t half = uint32_t{fp16[2 * i]} | uint32_t{fp16[2 * i + 1]} << 8;
    const uint32_t exponent = (half >> 10) & 0x1f;
    EXPECT_TRUE(exponent >= 10 && exponent <= 14) << half;
    float single = 0;
    std::memcpy(&single, &fp32[4 * i], sizeof single);
    EXPECT_TRUE(std::abs(single) >= 1.0f / 32 && std::abs(single) < 1.0f) << single;
  }
  EXPECT_EQ(random_operand_bytes(DType::kBf16, 1000, 7), bf16);  // deterministic
}

Op gemm_op(GemmRole role) {
  Op op;
  op.kind = OpKind::kGemm;
  op.gemm_role = role;
  op.shape.m = 8;
  op.shape.n = 16;
  op.shape.k = 32;
  return op;
}

TEST(CudaOpPlan, GemmsAreTheRuntimesOwnCalls) {
  // op C[8, 16], inner 32: the profile must time what CublasGemm's linear layer issues for
  // the same role (runtime/cuda/device_setup.h), its operand types and beta included.
  const OpLaunchPlan forward = plan_cuda_op(gemm_op(GemmRole::kForward));
  EXPECT_EQ(forward.kind, LaunchKind::kGemm);
  EXPECT_FALSE(forward.approximate);
  // y[rows 8, out 16] = x[8, in 32] W^T.
  EXPECT_EQ(forward.gemm.call, cuda::linear_forward_shape(8, 32, 16));
  EXPECT_EQ(forward.device_bytes(), (8 * 32 + 32 * 16 + 8 * 16) * 2);
  // dx[rows 8, in 16] = dy[8, out 32] W.
  const OpLaunchPlan dgrad = plan_cuda_op(gemm_op(GemmRole::kDgrad));
  EXPECT_EQ(dgrad.gemm.call, cuda::linear_dgrad_shape(8, 16, 32));
  // dW[out 8, in 16] += dy^T x over rows 32: fp32, beta 1, as training accumulates
  // micro-batches (before, the profile timed a bf16 GEMM with beta 0).
  const OpLaunchPlan wgrad = plan_cuda_op(gemm_op(GemmRole::kWgrad));
  EXPECT_EQ(wgrad.gemm.call, cuda::linear_wgrad_shape(32, 16, 8));
  EXPECT_TRUE(wgrad.gemm.call.fp32_output);
  EXPECT_TRUE(wgrad.gemm.call.accumulate);
  EXPECT_EQ(wgrad.device_bytes(), (8 * 32 + 32 * 16) * 2 + 8 * 16 * 4);
  // Whatever dtype the planner gave the op, the runtime's GEMMs read bf16.
  Op fp32 = gemm_op(GemmRole::kForward);
  fp32.dtype = DType::kFp32;
  EXPECT_EQ(plan_cuda_op(fp32).dtype, DType::kBf16);
}

TEST(CudaOpPlan, EveryGemmTheRuntimeWarmsIsOneTheProfileTimes) {
  // The runtime's set-up warms the calls its iterations make (device_setup.h,
  // model_gemm_shapes); for each, the planner op of that role and size must be planned to
  // the same call, so that profile and training run one kernel.
  RankShape d;
  d.tokens = 64;
  d.hidden = 32;
  d.q_width = 32;
  d.qkv_width = 48;
  d.ffn = 80;
  d.vocab_local = 100;
  for (const cuda::GemmShape& call : cuda::model_gemm_shapes(d, true, true)) {
    Op op = gemm_op(call.accumulate    ? GemmRole::kWgrad
                    : call.transpose_b ? GemmRole::kForward
                                       : GemmRole::kDgrad);
    op.shape.m = call.m;
    op.shape.n = call.n;
    op.shape.k = call.k;
    EXPECT_EQ(plan_cuda_op(op).gemm.call, call) << call.m << "x" << call.n << "x" << call.k;
  }
}

TEST(CudaOpPlan, GroupedGemmsRunOneGemmPerExpertAsTheRuntime) {
  // The runtime's MoE layer runs one linear GEMM per local expert on its own rows and
  // weights (runtime/model/moe_layers_padded.h); before, the profile timed one strided
  // batched GEMM instead.
  Op op = gemm_op(GemmRole::kForward);
  op.kind = OpKind::kGroupedGemm;
  op.shape.batch = 4;
  const OpLaunchPlan plan = plan_cuda_op(op);
  const cuda::GemmShape call = cuda::linear_forward_shape(8, 32, 16);
  const std::vector<GemmCallAt> calls = gemm_calls(plan.gemm);
  ASSERT_EQ(calls.size(), 4u);
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_EQ(calls[static_cast<size_t>(e)],
              (GemmCallAt{.call = call, .a = e * 8 * 32, .b = e * 32 * 16, .c = e * 8 * 16}));
  }
  // The buffers hold every expert's operands.
  EXPECT_EQ(plan.device_bytes(), 4 * (8 * 32 + 32 * 16 + 8 * 16) * 2);
}

TEST(CudaOpPlan, TheRoutersBackwardIsTheRuntimesDgrad) {
  Op op = gemm_op(GemmRole::kNone);
  op.kind = OpKind::kRouter;
  op.pass = Pass::kForward;  // logits[T 8, E 16] = x[8, h 32] W_r^T
  EXPECT_EQ(plan_cuda_op(op).gemm.call, cuda::linear_forward_shape(8, 32, 16));
  op.pass = Pass::kBackward;  // dx[T 8, h 16] = d logits[8, E 32] W_r
  EXPECT_EQ(plan_cuda_op(op).gemm.call, cuda::linear_dgrad_shape(8, 16, 32));
}

TEST(CudaOpPlan, AttentionRunsTheRuntimesKernels) {
  Op op;
  op.kind = OpKind::kAttention;
  op.pass = Pass::kBackward;
  op.shape = {.batch = 2,
              .heads = 32,
              .kv_heads = 8,
              .q_len = 4096,
              .kv_len = 4096,
              .head_dim = 128,
              .causal = true};
  const OpLaunchPlan plan = plan_cuda_op(op);
  EXPECT_EQ(plan.kind, LaunchKind::kAttention);
  EXPECT_FALSE(plan.approximate);
  EXPECT_EQ(plan.attention.batch, 2);
  EXPECT_EQ(plan.attention.seq, 4096);
  EXPECT_EQ(plan.attention.heads, 32);
  EXPECT_EQ(plan.attention.kv_heads, 8);
  EXPECT_EQ(plan.attention.head_dim, 128);
  EXPECT_TRUE(plan.attention.backward);
  // q, dq, out, dout: 4 x 2 x 4096 x 32 x 128 x 2 bytes; k, v, dk, dv with 8 heads; lse and
  // delta: 2 x 2 x 32 x 4096 x 4 bytes.
  const int64_t q = int64_t{2} * 4096 * 32 * 128 * 2;
  EXPECT_EQ(plan.device_bytes(), 4 * q + 4 * (q / 4) + 2 * (int64_t{2} * 32 * 4096 * 4));
  op.pass = Pass::kForward;
  EXPECT_FALSE(plan_cuda_op(op).attention.backward);
}

// A CP ring step (lib/dag_builder_cp.cc's fwd/bwd.attn_step<i>) runs the runtime's ring
// kernel: its own block at step 0, another rank's after; the plain causal op does not.
TEST(CudaOpPlan, RingStepsRunTheRingKernel) {
  Op op;
  op.kind = OpKind::kAttention;
  op.shape = {.batch = 1,
              .heads = 8,
              .kv_heads = 2,
              .q_len = 2048,
              .kv_len = 2048,
              .head_dim = 128,
              .causal = true};
  op.id = "fwd.flash_attn";
  EXPECT_FALSE(plan_cuda_op(op).attention.ring_step);
  op.id = "fwd.attn_step0";
  OpLaunchPlan plan = plan_cuda_op(op);
  EXPECT_EQ(plan.kind, LaunchKind::kAttention);
  EXPECT_FALSE(plan.approximate);
  EXPECT_TRUE(plan.attention.ring_step);
  EXPECT_TRUE(plan.attention.diagonal);
  EXPECT_FALSE(plan.attention.backward);
  // q, k, v, out, lse as the causal kernel, plus the state: (max, sum) and fp32 acc per row.
  const int64_t q = int64_t{2048} * 8 * 128 * 2, rows = int64_t{8} * 2048 * 4;
  EXPECT_EQ(plan.device_bytes(), 2 * q + 2 * (q / 4) + rows + 2 * rows + 2 * q);
  op.id = "bwd.attn_step3";
  op.pass = Pass::kBackward;
  plan = plan_cuda_op(op);
  EXPECT_TRUE(plan.attention.ring_step);
  EXPECT_FALSE(plan.attention.diagonal);
  EXPECT_TRUE(plan.attention.backward);
  // A local sequence that is not two whole chunks keeps the causal kernel.
  op.shape.q_len = op.shape.kv_len = 2047;
  EXPECT_FALSE(plan_cuda_op(op).attention.ring_step);
}

TEST(CudaOpPlan, AttentionTheKernelsDoNotTakeFallsBackToAStandInWithTheFlops) {
  Op op;
  op.kind = OpKind::kAttention;
  op.shape = {.batch = 1,
              .heads = 32,
              .kv_heads = 8,
              .q_len = 4096,
              .kv_len = 8192,  // context parallelism: a shard of queries against all keys
              .head_dim = 128,
              .causal = true};
  op.flops = 4.0 * 32 * 4096 * 4096 * 128;
  const OpLaunchPlan plan = plan_cuda_op(op);
  EXPECT_EQ(plan.kind, LaunchKind::kGemm);
  EXPECT_TRUE(plan.approximate);
  // m = 4096, k = 4096, causal half: n = 2 * 32 * 4096 * 4096 * 128 / (2 * 4096 * 4096) = 4096.
  EXPECT_EQ(plan.gemm.call.m, 4096);
  EXPECT_EQ(plan.gemm.call.k, 4096);
  EXPECT_EQ(plan.gemm.call.n, 4096);
  EXPECT_EQ(plan.gemm.repeats, 1);
  op.shape.q_len = 32768;  // 64x the flops per row: n = 32768, 2 launches
  op.shape.kv_len = 65536;
  op.flops = 4.0 * 32 * 32768 * 32768 * 128;
  const OpLaunchPlan longer = plan_cuda_op(op);
  EXPECT_EQ(longer.gemm.call.n, 16384);
  EXPECT_EQ(longer.gemm.repeats, 2);
  op.shape.kv_len = op.shape.q_len;
  op.shape.head_dim = 512;  // beyond the kernels' 256
  EXPECT_EQ(plan_cuda_op(op).kind, LaunchKind::kGemm);
}

TEST(CudaOpPlan, MemoryBoundOpsCopyTheirTraffic) {
  Op op;
  op.kind = OpKind::kNorm;
  op.bytes_read = 1000;
  op.bytes_written = 600;
  const OpLaunchPlan plan = plan_cuda_op(op);
  EXPECT_EQ(plan.kind, LaunchKind::kCopy);
  EXPECT_EQ(plan.copy_bytes, 800);
  EXPECT_TRUE(plan.approximate);
  EXPECT_EQ(plan.stand_in, "device copy of the op's memory traffic");
}

TEST(CudaOpPlan, CollectivesCountElementsOfTheFullBuffer) {
  Op op;
  op.kind = OpKind::kAllGather;
  op.dtype = DType::kBf16;
  op.comm_bytes = 1006;  // 503 elements: 501 is the largest multiple of 3
  op.group_size = 3;
  const OpLaunchPlan plan = plan_cuda_op(op);
  EXPECT_EQ(plan.kind, LaunchKind::kAllGather);
  EXPECT_EQ(plan.elements, 501);
  EXPECT_EQ(plan.device_bytes(), (501 + 167) * 2);
  EXPECT_FALSE(plan.approximate);
  op.group_size = 1;
  EXPECT_EQ(error_text([&] { plan_cuda_op(op); }),
            "all_gather:bf16:bytes=1006:tp1:local: a group of 1 rank has nothing to "
            "communicate");
}

}  // namespace
}  // namespace dhelix::cuda_profile
