// The cuda profiler backend on a GPU: event timing of solo runs and pairs, and the cuBLAS
// GEMM closure. Every test that needs a device skips itself when cudaGetDeviceCount finds
// none; the no-device message is checked where there is no device.

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/error.h"
#include "profiler/cuda/cuda_backend.h"
#include "profiler/cuda/cuda_device.h"
#include "profiler/cuda/cuda_op_runner.h"
#include "profiler/cuda/cuda_timer.h"
#include "profiler/sampling.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda_profile {
namespace {

bool have_device() {
  int count = 0;
  const bool found = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return found;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device"

TEST(CudaProfilerDevice, NoDeviceMessageOrDeviceFound) {
  if (have_device()) {
    EXPECT_NO_THROW(check_cuda_device_present());
    return;
  }
  try {
    check_cuda_device_present();
    FAIL() << "no error without a device";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    const std::string text = error.what();
    const std::string prefix = "--backend cuda: no CUDA device found (cudaGetDeviceCount: ";
    EXPECT_EQ(text.substr(0, prefix.size()), prefix) << text;
    EXPECT_EQ(text.back(), ')');
  }
}

// A device-to-device copy of `bytes`, enqueued on the stream it is given.
struct CopyOp {
  explicit CopyOp(size_t bytes) : bytes_(bytes) {
    DHELIX_CUDA(cudaMalloc(&from_, bytes));
    DHELIX_CUDA(cudaMalloc(&to_, bytes));
  }
  ~CopyOp() {
    (void)cudaFree(from_);
    (void)cudaFree(to_);
  }
  Enqueue enqueue() const {
    return [this](cudaStream_t stream) {
      DHELIX_CUDA(cudaMemcpyAsync(to_, from_, bytes_, cudaMemcpyDeviceToDevice, stream));
    };
  }
  size_t bytes_;
  void* from_ = nullptr;
  void* to_ = nullptr;
};

double median(std::vector<double> values) { return sampling::median(std::move(values)); }

TEST(CudaProfilerDevice, SoloTimesGrowWithTheWork) {
  SKIP_WITHOUT_DEVICE();
  const DeviceInfo info = use_device(0);
  EXPECT_GT(info.l2_bytes, 0);
  CudaTimer timer(info.l2_bytes);
  const CopyOp small(1 << 20), large(256 << 20);
  const std::vector<double> small_us =
      timer.time_solo(small.enqueue(), StreamRole::kCompute, 20, {});
  const std::vector<double> large_us =
      timer.time_solo(large.enqueue(), StreamRole::kCompute, 20, {});
  ASSERT_EQ(small_us.size(), 20u);
  for (double t : small_us) EXPECT_GT(t, 0);
  // 256 MiB against 1 MiB: at least 10x longer whatever the GPU.
  EXPECT_GT(median(large_us), 10 * median(small_us));
  int calls = 0;
  timer.time_solo(small.enqueue(), StreamRole::kComm0, 3, [&calls] { ++calls; });
  EXPECT_EQ(calls, 3);
}

TEST(CudaProfilerDevice, PairFinishTimesAreFromTheCommonStart) {
  SKIP_WITHOUT_DEVICE();
  const DeviceInfo info = use_device(0);
  CudaTimer timer(info.l2_bytes);
  const CopyOp a(64 << 20), b(1 << 20);
  const double solo_a = median(timer.time_solo(a.enqueue(), StreamRole::kCompute, 15, {}));
  const std::vector<CoRunSample> pair =
      timer.time_pair(a.enqueue(), StreamRole::kCompute, b.enqueue(), StreamRole::kComm0, 15, {});
  ASSERT_EQ(pair.size(), 15u);
  std::vector<double> finish_a, finish_b;
  for (const CoRunSample& s : pair) {
    finish_a.push_back(s.finish_a_us);
    finish_b.push_back(s.finish_b_us);
  }
  // The small copy ends first; the large one is no faster than alone (5 % noise allowed).
  EXPECT_LT(median(finish_b), median(finish_a));
  EXPECT_GT(median(finish_a), 0.95 * solo_a);
  EXPECT_LT(timer.max_start_lag_us(), 1000);
}

TEST(CudaProfilerDevice, GemmClosureReachesTensorCoreRates) {
  SKIP_WITHOUT_DEVICE();
  const DeviceInfo info = use_device(0);
  ParallelSpec parallel;
  const Placement placement(parallel, 1);
  CudaOpRunner runner(placement, {}, 0, MPI_COMM_NULL);  // no collectives: no MPI needed
  Op op;
  op.kind = OpKind::kGemm;
  op.gemm_role = GemmRole::kForward;
  op.dtype = DType::kBf16;
  op.shape.m = op.shape.n = op.shape.k = 4096;
  const CudaRunnableOp gemm = runner.make(op, 0);
  EXPECT_FALSE(gemm.plan.approximate);
  CudaTimer timer(info.l2_bytes);
  const double time_us = median(timer.time_solo(gemm.enqueue, StreamRole::kCompute, 20, {}));
  const double tflops = 2.0 * 4096.0 * 4096.0 * 4096.0 / (time_us * 1e-6) / 1e12;
  // bf16 tensor cores: A100 312, H100 989 peak dense; 50 is far below either.
  EXPECT_GT(tflops, 50) << time_us << " us";
}

}  // namespace
}  // namespace dhelix::cuda_profile
