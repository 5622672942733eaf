// The model on the CUDA backend against the same model on the CPU (tp = 1, the whole
// 2-layer tiny Llama, one micro-batch): the same op wiring (runtime/model/*) run with bf16
// activations must give the CPU's loss and gradients within bf16's error. Skips without a
// GPU.
//
// Tolerances. bf16 keeps 8 significant bits: each stored activation is off by up to 2^-9
// relative (0.2 %). Two layers of about a dozen rounded tensors each compound that to a
// few percent on individual gradient elements, so elements are not compared one by one;
// whole tensors are, by relative L2 error (|g_gpu - g_cpu| / |g_cpu| < 5 %), which a wiring
// error (a wrong buffer, a missing accumulation, a transposed GEMM) exceeds by far: it
// gives errors of order 100 %. The loss, an average over 32 tokens, agrees to 1 %.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/cuda_stage_model.h"
#include "runtime/cuda/device_pool.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::test {
namespace {

double relative_l2_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - static_cast<double>(expected[i]);
    difference += d * d;
    norm += static_cast<double>(expected[i]) * static_cast<double>(expected[i]);
  }
  return norm == 0.0 ? std::sqrt(difference) : std::sqrt(difference / norm);
}

// One stream, its GEMM handle and a pool: what a CUDA model needs to run its ops.
struct DeviceContext {
  DeviceContext() {
    DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = std::make_unique<cuda::CublasGemm>(stream);
    pool = std::make_unique<cuda::DevicePool>(stream);
    DHELIX_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  }
  ~DeviceContext() {
    static_cast<void>(cudaStreamSynchronize(stream));
    pool.reset();
    gemm.reset();
    static_cast<void>(cudaFree(workspace));
    static_cast<void>(cudaStreamDestroy(stream));
  }
  cuda::CudaBackend::Exec exec() const {
    return {.stream = stream, .gemm = gemm.get(), .workspace = {workspace, kWorkspaceBytes}};
  }
  static constexpr int64_t kWorkspaceBytes = int64_t{4} << 20;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::unique_ptr<cuda::CublasGemm> gemm;
  std::unique_ptr<cuda::DevicePool> pool;
};

std::vector<float> download_gradient(const cuda::CudaStageModel::ParameterView& p) {
  std::vector<float> host(static_cast<size_t>(p.count));
  DHELIX_CUDA(cudaDeviceSynchronize());
  DHELIX_CUDA(
      cudaMemcpy(host.data(), p.gradient, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

TEST(CudaStageModel, MatchesTheCpuModelWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  const JobSpec job = tiny_job(1, false);
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 11);

  TpGroup cpu(job, 7);
  cpu.start_iteration(1);
  cpu.set_tokens(0, tokens);
  cpu.forward(0);
  cpu.backward(0);

  DeviceContext device;
  BasicTpGroup<cuda::CudaBackend> gpu(job, 7, 0, 0, -1, true, true,
                                      cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                      device.exec());
  gpu.start_iteration(1);
  gpu.set_tokens(0, tokens);
  gpu.forward(0);
  gpu.backward(0);
  DHELIX_CUDA(cudaStreamSynchronize(device.stream));

  const float cpu_loss = cpu.model(0).micro_batch_losses().at(0);
  const float gpu_loss = gpu.model(0).micro_batch_losses().at(0);
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);

  const std::vector<rt::ParameterView> expected = cpu.model(0).parameters();
  const std::vector<cuda::CudaStageModel::ParameterView> actual = gpu.model(0).parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].name, expected[i].name);
    const std::vector<float> want(expected[i].gradient, expected[i].gradient + expected[i].count);
    EXPECT_LT(relative_l2_error(download_gradient(actual[i]), want), 0.05) << expected[i].name;
  }
}

TEST(CudaStageModel, RunningTheIterationTwiceGivesTheSameBits) {
  DHELIX_REQUIRE_GPUS(1);
  const JobSpec job = tiny_job(1, false);
  DeviceContext device;
  BasicTpGroup<cuda::CudaBackend> gpu(job, 7, 0, 0, -1, true, true,
                                      cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                      device.exec());
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    gpu.start_iteration(1);
    gpu.set_tokens(0, random_tokens(32, 256, 11));
    gpu.forward(0);
    gpu.backward(0);
    DHELIX_CUDA(cudaStreamSynchronize(device.stream));
    const auto params = gpu.model(0).parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<float> gradient = download_gradient(params[i]);
      if (run == 0) {
        first.push_back(gradient);
      } else {
        EXPECT_EQ(gradient, first[i]) << params[i].name << ": the kernels are not deterministic";
      }
    }
  }
}

}  // namespace
}  // namespace dhelix::test
