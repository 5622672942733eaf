// NCCL all_gather and reduce_scatter between two GPUs of this machine: two threads, one
// DeviceCommunicator each, joined through one unique id (the MPI bootstrap, without MPI).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/cuda/nccl_communicator.h"

#include "runtime/cuda/cuda_device_api.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

struct MemberResult {
  std::vector<float> gathered;
  std::vector<float> reduced;
};

void run_member(const CommId& id, int rank, int64_t count, MemberResult* result) {
  DHELIX_CUDA(cudaSetDevice(rank));
  cudaStream_t cuda_stream = nullptr;
  DHELIX_CUDA(cudaStreamCreate(&cuda_stream));
  auto* stream = reinterpret_cast<StreamHandle>(cuda_stream);
  {
    CudaDeviceApi api;
    DeviceCommunicator comm(api, 2, rank, "tp", [&](CommId& shared) { shared = id; },
                            {.timeout_s = 60, .world_rank = rank});
    std::vector<float> mine(static_cast<size_t>(count)), scatter_in(static_cast<size_t>(2 * count));
    for (int64_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 100 + i);
    for (int64_t i = 0; i < 2 * count; ++i) scatter_in[i] = static_cast<float>((rank + 1) * i);
    testing::DeviceBuffer<float> in(mine), gathered(2 * count), scatter(scatter_in), reduced(count);
    comm.all_gather(in.get(), count, DeviceDtype::kFloat32, gathered.get(), stream);
    comm.reduce_scatter_sum(scatter.get(), count, DeviceDtype::kFloat32, reduced.get(), stream);
    comm.wait(stream);
    comm.poll();
    result->gathered = gathered.download();
    result->reduced = reduced.download();
  }
  DHELIX_CUDA(cudaStreamDestroy(cuda_stream));
}

TEST(NcclCommunicator, AllGatherAndReduceScatterOverTwoGpus) {
  DHELIX_REQUIRE_GPUS(2);
  const CommId id = CudaDeviceApi().comm_unique_id();
  const int64_t count = 1000;
  MemberResult results[2];
  std::thread first([&] { run_member(id, 0, count, &results[0]); });
  std::thread second([&] { run_member(id, 1, count, &results[1]); });
  first.join();
  second.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(results[rank].gathered.size(), 2u * count);
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(results[rank].gathered[i], static_cast<float>(i));
      EXPECT_EQ(results[rank].gathered[count + i], static_cast<float>(100 + i));
      // Member r gets block r of (1 * j) + (2 * j) = 3 j, j = r * count + i: exact in fp32.
      EXPECT_EQ(results[rank].reduced[i], static_cast<float>(3 * (rank * count + i)));
    }
  }
}

}  // namespace
}  // namespace dhelix::cuda
