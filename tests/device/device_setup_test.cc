#include "runtime/cuda/device_setup.h"

#include <gtest/gtest.h>

#include "tests/device/recording_device.h"

namespace dhelix::cuda {
namespace {

TEST(DeviceSetup, LinearShapesAreCublasGemmsContracts) {
  // y[4, 2] = x[4, 3] W^T: gemm(no, transposed, m 4, n 2, k 3) (cublas_gemm.h's example).
  EXPECT_EQ(linear_forward_shape(4, 3, 2), (GemmShape{false, true, 4, 2, 3, false}));
  // dx[4, 3] = dy[4, 2] W[2, 3].
  EXPECT_EQ(linear_dgrad_shape(4, 3, 2), (GemmShape{false, false, 4, 3, 2, false}));
  // dW[2, 3] += dy^T x, fp32, beta 1 (accumulating).
  EXPECT_EQ(linear_wgrad_shape(4, 3, 2), (GemmShape{true, false, 2, 3, 4, true, true}));
}

TEST(DeviceSetup, ModelShapesCoverLayersAndHead) {
  RankShape d;
  d.tokens = 8;
  d.hidden = 16;
  d.q_width = 16;
  d.qkv_width = 32;
  d.ffn = 24;
  d.vocab_local = 50;
  EXPECT_EQ(model_gemm_shapes(d, true, false).size(), 12u);  // 4 linears x 3
  EXPECT_EQ(model_gemm_shapes(d, true, true).size(), 15u);
  EXPECT_EQ(model_gemm_shapes(d, false, true).size(), 3u);
  EXPECT_TRUE(model_gemm_shapes(d, false, false).empty());
}

TEST(DeviceSetup, PrepareLoadsRaisesTheStackAndWarmsInOrder) {
  testing::RecordingDevice device(/*kernel_stack_bytes=*/3000);
  const std::vector<GemmShape> shapes = {linear_forward_shape(4, 3, 2),
                                         linear_dgrad_shape(4, 3, 2)};
  const DevicePreparation done = prepare_device(device, shapes, std::nullopt, nullptr);
  EXPECT_EQ(done.stack_bytes, 3000);
  EXPECT_EQ(done.gemm_shapes, 2);
  using Kind = testing::DeviceCall::Kind;
  std::vector<Kind> kinds;
  for (const auto& call : device.calls()) kinds.push_back(call.kind);
  EXPECT_EQ(kinds, (std::vector<Kind>{Kind::kLoadKernels, Kind::kStackLimit, Kind::kWarmGemm,
                                      Kind::kWarmGemm, Kind::kSynchronize}));
  // A kernel needing less than CUDA's default 1024 bytes leaves the default.
  testing::RecordingDevice small(100);
  EXPECT_EQ(prepare_device(small, {}, std::nullopt, nullptr).stack_bytes, 1024);
}

}  // namespace
}  // namespace dhelix::cuda
