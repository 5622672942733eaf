// profiler/cpu/cold_operands.h: which ops are timed on operands out of the caches, how many
// copies of their buffers they get, and that the copies are used in turn.

#include "profiler/cpu/cold_operands.h"

#include <vector>

#include <gtest/gtest.h>

namespace dhelix::cpu_profile {
namespace {

Op gemm(int64_t m, int64_t n, int64_t k) {
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = DType::kFp32;
  op.shape = {.m = m, .n = n, .k = k};
  return op;
}

TEST(ColdOperands, OnlyOpsThatReadParametersAreCycled) {
  for (const OpKind kind :
       {OpKind::kGemm, OpKind::kGroupedGemm, OpKind::kRouter, OpKind::kEmbedding, OpKind::kHead}) {
    EXPECT_TRUE(reads_parameters(kind)) << static_cast<int>(kind);
  }
  for (const OpKind kind : {OpKind::kAttention, OpKind::kNorm, OpKind::kActivation,
                            OpKind::kBiasDropoutAdd, OpKind::kLoss, OpKind::kPermute,
                            OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kSendRecv}) {
    EXPECT_FALSE(reads_parameters(kind)) << static_cast<int>(kind);
  }
}

TEST(ColdOperands, CopiesAreTheFewestThatExceedTheCache) {
  // cold_operands.h's example: 768 KiB a copy against 32 MiB -> 43 copies (33 MiB > 32 MiB;
  // 42 copies would be 31.5 MiB).
  EXPECT_EQ(cold_copies(768 << 10, 32 << 20), 43);
  EXPECT_EQ(cold_copies(32 << 20, 32 << 20), 2);  // one copy only fills it
  EXPECT_EQ(cold_copies(64 << 20, 32 << 20), 1);  // one copy exceeds it already
  EXPECT_EQ(cold_copies(4096, 32 << 20), kMaxColdCopies);
  EXPECT_EQ(cold_copies(768 << 10, 0), 1);  // --warm-caches
  EXPECT_EQ(cold_copies(0, 32 << 20), 1);
}

TEST(ColdOperands, RunsTakeTheCopiesInTurn) {
  std::vector<int> order;
  std::vector<RunnableOp> copies;
  for (int i = 0; i < 3; ++i) {
    copies.push_back({.run = [&order, i] { order.push_back(i); }, .buffer_bytes = 100});
  }
  const RunnableOp cycled = cycle_runnables(std::move(copies));
  EXPECT_EQ(cycled.buffer_bytes, 300);
  for (int run = 0; run < 7; ++run) cycled.run();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
}

TEST(ColdOperands, AGemmOwnsEnoughCopiesToLeaveTheCache) {
  // 64 x 64 x 64 fp32: A, B and C of 16 KiB each, 48 KiB a copy; against 1 MiB, 22 copies.
  const Op op = gemm(64, 64, 64);
  const RunnableOp hot = make_cold_runnable_op(op, {}, 0);
  EXPECT_EQ(hot.buffer_bytes, 3 * 64 * 64 * 4);
  const RunnableOp cold = make_cold_runnable_op(op, {}, 1 << 20);
  EXPECT_EQ(cold.buffer_bytes, 22 * hot.buffer_bytes);
  for (int run = 0; run < 30; ++run) cold.run();  // every copy runs, and the first again
}

TEST(ColdOperands, OtherOpsKeepOneSetOfBuffers) {
  Op norm;
  norm.kind = OpKind::kNorm;
  norm.dtype = DType::kFp32;
  norm.variant = "rmsnorm";
  norm.shape = {.m = 64, .n = 64};
  EXPECT_EQ(make_cold_runnable_op(norm, {}, 1 << 20).buffer_bytes,
            make_runnable_op(norm, {}).buffer_bytes);
}

TEST(ColdOperands, TheHostCacheIsKnown) {
  // sysfs or sysconf on Linux; 32 MiB where neither says.
  EXPECT_GT(host_last_level_cache_bytes(), 0);
}

}  // namespace
}  // namespace dhelix::cpu_profile
