// CudaDeviceApi on a real GPU (skipped without one): the calls the fake-device tests
// (tests/device/) only record.
#include "runtime/cuda/cuda_device_api.h"

#include <gtest/gtest.h>

#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/device_setup.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/cuda/moe_shared_cuda.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

TEST(CudaDeviceApi, StreamsHavePrioritiesAndEventsOrderThem) {
  DHELIX_REQUIRE_GPUS(1);
  CudaDeviceApi api;
  int least = 0, greatest = 0;
  DHELIX_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  StreamHandle low = api.create_stream(false), high = api.create_stream(true);
  int priority = 0;
  DHELIX_CUDA(cudaStreamGetPriority(reinterpret_cast<cudaStream_t>(low), &priority));
  EXPECT_EQ(priority, least);
  DHELIX_CUDA(cudaStreamGetPriority(reinterpret_cast<cudaStream_t>(high), &priority));
  EXPECT_EQ(priority, greatest);
  EventHandle event = api.create_event(false);
  api.delay(1000, low);
  api.record_event(event, low);
  api.wait_event(high, event);
  api.synchronize_device();
  EXPECT_TRUE(api.stream_done(high));
  api.destroy_event(event);
  api.destroy_stream(low);
  api.destroy_stream(high);
}

TEST(CudaDeviceApi, LoadsEveryKernelAndReportsTheirStack) {
  DHELIX_REQUIRE_GPUS(1);
  CudaDeviceApi api;
  const KernelInventory inventory = api.load_kernels();
  EXPECT_EQ(inventory.kernels,
            static_cast<int64_t>(rowwise_kernels().size() + embedding_kernels().size() +
                                 attention_kernels().size() + ring_attention_kernels().size() +
                                 moe_kernels().size() + moe_shared_kernels().size() +
                                 delay_kernels().size()));
  // The attention kernels keep per-thread arrays of head_dim floats (ptxas: 2 to 4 KiB).
  EXPECT_GT(inventory.max_stack_bytes, 1024);
  EXPECT_FALSE(inventory.largest_stack_kernel.empty());
  api.set_stack_limit(inventory.max_stack_bytes);
  size_t limit = 0;
  DHELIX_CUDA(cudaDeviceGetLimit(&limit, cudaLimitStackSize));
  EXPECT_GE(static_cast<int64_t>(limit), inventory.max_stack_bytes);
}

TEST(CudaDeviceApi, WarmsGemmShapesOnTheStreamsHandle) {
  DHELIX_REQUIRE_GPUS(1);
  CudaDeviceApi api;
  StreamHandle stream = api.create_stream(false);
  for (const GemmShape& shape : {linear_forward_shape(64, 96, 32), linear_dgrad_shape(64, 96, 32),
                                 linear_wgrad_shape(64, 96, 32)}) {
    api.warm_gemm(shape, stream);
  }
  EXPECT_EQ(api.gemm_for(stream).stream(), reinterpret_cast<cudaStream_t>(stream));
  api.destroy_stream(stream);
}

}  // namespace
}  // namespace dhelix::cuda
