// Physical lower bounds on op times (lib/profile_bounds.h), worked by hand.
#include "lib/profile_bounds.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/cluster_reader.h"
#include "lib/error.h"

namespace dhelix {
namespace {

Op gemm(int64_t m, int64_t n, int64_t k) {
  Op op;
  op.id = "fwd.gemm";
  op.kind = OpKind::kGemm;
  op.shape = {.m = m, .n = n, .k = k};
  op.flops = 2.0 * static_cast<double>(m * n * k);
  return op;
}

Op collective(OpKind kind, int64_t bytes, int64_t ranks, GroupScope scope = GroupScope::kLocal) {
  Op op;
  op.id = "fwd.comm";
  op.kind = kind;
  op.comm_bytes = bytes;
  op.group_size = ranks;
  op.scope = scope;
  op.stream = scope == GroupScope::kLocal ? StreamClass::kLocalComm : StreamClass::kCrossComm;
  return op;
}

Profile profile_of(const std::vector<Op>& ops, double time_us) {
  Profile profile;
  for (const Op& op : ops) {
    profile.add_op({.signature = op.signature(),
                    .kind = op.kind,
                    .stream = op.stream,
                    .example_op_id = op.id,
                    .time_us = TimeStats::exactly(time_us)});
  }
  return profile;
}

std::string refusal(const Profile& profile, const std::vector<Op>& ops,
                    const ClusterSpec& cluster) {
  try {
    check_profile_bounds(profile, ops, cluster, "p.json");
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  return "";
}

TEST(ProfileBounds, GemmAtPeak) {
  // The header's worked example: 1.718e11 FLOPs at 989 TFLOP/s = 173.7 us.
  const ClusterSpec h100 = cluster_preset("h100");
  const Op op = gemm(8192, 1280, 8192);
  EXPECT_NEAR(minimum_op_time_us(h100, op), 2.0 * 8192 * 1280 * 8192 / 989e6, 1e-9);
  EXPECT_NEAR(minimum_op_time_us(h100, op), 173.7, 0.05);
}

TEST(ProfileBounds, CausalAttentionCountsTheMaskedHalfOnly) {
  Op op;
  op.kind = OpKind::kAttention;
  op.shape = {.batch = 1, .heads = 8, .q_len = 4096, .kv_len = 4096, .head_dim = 128};
  op.shape.causal = true;
  op.flops = 4.0 * 8 * 4096 * 4096 * 128;  // Megatron's count: every pair
  EXPECT_DOUBLE_EQ(minimum_work_flops(op), op.flops / 2);
  op.pass = Pass::kBackward;
  op.flops *= 2;
  EXPECT_DOUBLE_EQ(minimum_work_flops(op), op.flops / 2);
  // A window of 1024 keys: q·w - w²/2 pairs.
  op.pass = Pass::kForward;
  op.shape.window = 1024;
  op.flops = 4.0 * 8 * 4096 * 1024 * 128;
  EXPECT_DOUBLE_EQ(minimum_work_flops(op), 4.0 * 8 * (4096.0 * 1024 - 1024.0 * 1024 / 2) * 128);
  op.shape.causal = false;
  EXPECT_DOUBLE_EQ(minimum_work_flops(op), op.flops);
}

TEST(ProfileBounds, CollectivesAtTheLinkBandwidth) {
  const ClusterSpec h100 = cluster_preset("h100");
  const double bytes = 64.0 * (1 << 20);
  const double local = h100.intra_node.bandwidth_gbps * 1e3;  // bytes per us
  EXPECT_DOUBLE_EQ(minimum_op_time_us(h100, collective(OpKind::kAllGather, 64 << 20, 8)),
                   bytes * 7 / 8 / local);
  EXPECT_DOUBLE_EQ(minimum_op_time_us(h100, collective(OpKind::kAllReduce, 64 << 20, 8)),
                   bytes * 7 / 8 / local);
  EXPECT_DOUBLE_EQ(minimum_op_time_us(h100, collective(OpKind::kReduceScatter, 64 << 20, 8)),
                   bytes / 8 / local);
  EXPECT_DOUBLE_EQ(minimum_op_time_us(h100, collective(OpKind::kSendRecv, 64 << 20, 2)),
                   bytes / local);
  EXPECT_DOUBLE_EQ(minimum_op_time_us(h100, collective(OpKind::kAllGather, 64 << 20, 1)), 0);
  const double cross =
      local + static_cast<double>(h100.nics_per_node) * h100.inter_node.bandwidth_gbps * 1e3;
  EXPECT_DOUBLE_EQ(
      minimum_op_time_us(h100, collective(OpKind::kAllToAll, 64 << 20, 16, GroupScope::kCrossNode)),
      bytes * 15 / 16 / cross);
}

TEST(ProfileBounds, ImpossibleTimesAreRefusedWithPointerValueAndBound) {
  const ClusterSpec h100 = cluster_preset("h100");
  const std::vector<Op> ops = {gemm(8192, 1280, 8192), collective(OpKind::kAllGather, 64 << 20, 8)};
  EXPECT_EQ(refusal(profile_of(ops, 1000), ops, h100), "");
  const std::string tiny = refusal(profile_of(ops, 1e-300), ops, h100);
  EXPECT_NE(tiny.find("p.json: 2 times are faster than the job's cluster h100 (GPU H100-SXM) "
                      "can run their ops"),
            std::string::npos)
      << tiny;
  EXPECT_NE(tiny.find("p.json: /ops/0/time_us/median: 1e-300 us is faster than the hardware "
                      "allows for op gemm:bf16:m=8192,n=1280,k=8192: its 1.71799e+11 FLOPs need "
                      "at least 173.709 us at the GPU's peak of 989 TFLOP/s (cluster "
                      "gpu.peak_bf16_tflops)"),
            std::string::npos)
      << tiny;
  EXPECT_NE(tiny.find("p.json: /ops/1/time_us/median: 1e-300 us is faster than the hardware allows "
                      "for op all_gather:"),
            std::string::npos)
      << tiny;
  const std::string zero = refusal(profile_of(ops, 0), ops, h100);
  EXPECT_NE(zero.find("/ops/0/time_us/median: 0 us for op gemm:bf16:m=8192,n=1280,k=8192: no op "
                      "that does work takes zero time"),
            std::string::npos)
      << zero;
}

TEST(ProfileBounds, TheFileRoundingIsAllowedNoMore) {
  const ClusterSpec h100 = cluster_preset("h100");
  const std::vector<Op> ops = {gemm(128, 128, 128)};  // 4.19e6 FLOPs: 0.0042411 us
  const double least = minimum_op_time_us(h100, ops[0]);
  EXPECT_EQ(refusal(profile_of(ops, quantize_profile_value(least)), ops, h100), "");
  EXPECT_NE(refusal(profile_of(ops, least - 1e-4), ops, h100), "");
  EXPECT_NE(refusal(profile_of(ops, 0), ops, h100), "");
}

// The median is what the planner prices; the fastest sample may undercut the bound by a
// timer's resolution (a trace of a CPU rank once kept 0.02 us for a 64 x 64 elementwise op
// whose bound is 0.02048 us) and is not refused for it. A median below the bound is.
TEST(ProfileBounds, TheMedianIsBoundedNotTheFastestSample) {
  const ClusterSpec h100 = cluster_preset("h100");
  const std::vector<Op> ops = {gemm(8192, 1280, 8192)};
  const double least = minimum_op_time_us(h100, ops[0]);
  Profile noisy = profile_of(ops, 1.2 * least);
  ProfiledOp fastest = noisy.ops()[0];
  Profile with_fast_sample;
  fastest.time_us.min_us = 0.9 * least;
  with_fast_sample.add_op(fastest);
  EXPECT_EQ(refusal(with_fast_sample, ops, h100), "");
  ProfiledOp slow_median = fastest;
  slow_median.time_us.median_us = 0.9 * least;
  Profile below;
  below.add_op(slow_median);
  EXPECT_NE(refusal(below, ops, h100).find("/ops/0/time_us/median"), std::string::npos);
}

// An embedding lookup does no FLOPs but moves memory: zero is refused; a small time passes
// (no memory-bandwidth bound: small tensors are served from caches faster than DRAM).
TEST(ProfileBounds, MemoryWorkCannotTakeZeroTime) {
  const ClusterSpec h100 = cluster_preset("h100");
  Op op;
  op.id = "fwd.embedding";
  op.kind = OpKind::kEmbedding;
  op.shape = {.m = 128, .n = 64, .k = 128};
  op.bytes_read = 32768;
  op.bytes_written = 32768;
  const std::vector<Op> ops = {op};
  const std::string message = refusal(profile_of(ops, 0), ops, h100);
  EXPECT_NE(message.find("/ops/0/time_us/median: 0 us for op " + op.signature() +
                         ": no op that does work takes zero time: it moves 65536 bytes of "
                         "device memory"),
            std::string::npos)
      << message;
  EXPECT_EQ(refusal(profile_of(ops, 1e-3), ops, h100), "");
}

// Elementwise work has no FLOP bound (memory-bound, fusable, or skipped: the CPU runtime's
// bias-dropout-add backward was traced at 0.02 us, under its 8192 FLOPs at the cpu-host
// peak); below a timer's 1 ns resolution it is still refused.
TEST(ProfileBounds, ElementwiseWorkIsBoundedByTheTimerOnly) {
  const ClusterSpec cpu =
      read_cluster(std::string(DHELIX_SOURCE_DIR) + "/examples/clusters/cpu-host.json");
  Op op;
  op.id = "bwd.bias_dropout_add";
  op.kind = OpKind::kBiasDropoutAdd;
  op.shape = {.m = 64, .n = 64};
  op.flops = 8192;
  const std::vector<Op> ops = {op};
  EXPECT_EQ(minimum_op_time_us(cpu, op), 0);
  EXPECT_EQ(refusal(profile_of(ops, 0.02), ops, cpu), "");
  EXPECT_NE(
      refusal(profile_of(ops, 1e-300), ops, cpu).find("below the 1 ns resolution of any timer"),
      std::string::npos);
  EXPECT_NE(refusal(profile_of(ops, 0), ops, cpu).find("it does 8192 FLOPs"), std::string::npos);
}

TEST(ProfileBounds, OpsWithoutWorkMayTakeZeroTime) {
  const ClusterSpec h100 = cluster_preset("h100");
  const std::vector<Op> ops = {collective(OpKind::kAllGather, 1 << 20, 1), gemm(0, 0, 0)};
  EXPECT_EQ(refusal(profile_of(ops, 0), ops, h100), "");
}

TEST(ProfileBounds, PairFinishTimesAreBoundedToo) {
  const ClusterSpec h100 = cluster_preset("h100");
  const std::vector<Op> ops = {gemm(8192, 1280, 8192), collective(OpKind::kAllGather, 64 << 20, 8)};
  Profile profile = profile_of(ops, 1000);
  profile.add_pair({.a = ops[0].signature(),
                    .b = ops[1].signature(),
                    .finish_a_us = 1,
                    .finish_b_us = 1000,
                    .makespan_us = 1000});
  const std::string message = refusal(profile, ops, h100);
  EXPECT_NE(message.find("p.json: /pairs/0/finish_b_us: 1 us is faster than the hardware allows "
                         "for op gemm:"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("finish_a_us"), std::string::npos) << message;
}

TEST(ProfileBounds, OnlyTheFirstEightAreListed) {
  const ClusterSpec h100 = cluster_preset("h100");
  std::vector<Op> ops;
  for (int64_t i = 1; i <= 10; ++i) ops.push_back(gemm(1024 * i, 1024, 1024));
  const std::string message = refusal(profile_of(ops, 0), ops, h100);
  EXPECT_NE(message.find("p.json: 10 times are faster"), std::string::npos) << message;
  EXPECT_NE(message.find("/ops/7/time_us/median"), std::string::npos) << message;
  EXPECT_EQ(message.find("/ops/8/time_us/median"), std::string::npos) << message;
  EXPECT_NE(message.find("\n... and 2 more"), std::string::npos) << message;
}

}  // namespace
}  // namespace dhelix
