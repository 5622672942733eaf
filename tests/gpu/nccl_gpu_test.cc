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

// The CP ring's step and the padded all-to-all (nccl_communicator.h) between two GPUs.
struct RingResult {
  std::vector<float> ring;
  std::vector<float> blocks;
  std::vector<int64_t> counts;
};

void run_ring_member(const CommId& id, int rank, int64_t count, RingResult* result) {
  DHELIX_CUDA(cudaSetDevice(rank));
  cudaStream_t cuda_stream = nullptr;
  DHELIX_CUDA(cudaStreamCreate(&cuda_stream));
  auto* stream = reinterpret_cast<StreamHandle>(cuda_stream);
  {
    CudaDeviceApi api;
    DeviceCommunicator comm(api, 2, rank, "cp", [&](CommId& shared) { shared = id; },
                            {.timeout_s = 60, .world_rank = rank});
    std::vector<float> mine(static_cast<size_t>(count)), blocks_in(static_cast<size_t>(2 * count));
    for (int64_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 1000 + i);
    // Block j (for member j) holds 10000 * rank + 100 * j + i.
    for (int64_t i = 0; i < 2 * count; ++i) {
      blocks_in[i] = static_cast<float>(10000 * rank + 100 * (i / count) + i % count);
    }
    const std::vector<int64_t> send_counts = {rank * 10 + 1, rank * 10 + 2, rank * 10 + 3,
                                              rank * 10 + 4};  // 2 members x 2 chunks
    testing::DeviceBuffer<float> in(mine), received(count), blocks(blocks_in), out(2 * count);
    testing::DeviceBuffer<int64_t> counts_in(send_counts), counts_out(4);
    comm.ring_exchange(in.get(), received.get(), count, DeviceDtype::kFloat32, stream);
    comm.all_to_all_v(blocks.get(), counts_in.get(), 2, out.get(), counts_out.get(), count,
                      DeviceDtype::kFloat32, stream);
    comm.wait(stream);
    comm.poll();
    result->ring = received.download();
    result->blocks = out.download();
    result->counts = counts_out.download();
  }
  DHELIX_CUDA(cudaStreamDestroy(cuda_stream));
}

TEST(NcclCommunicator, RingExchangeAndPaddedAllToAllOverTwoGpus) {
  DHELIX_REQUIRE_GPUS(2);
  const CommId id = CudaDeviceApi().comm_unique_id();
  const int64_t count = 500;
  RingResult results[2];
  std::thread first([&] { run_ring_member(id, 0, count, &results[0]); });
  std::thread second([&] { run_ring_member(id, 1, count, &results[1]); });
  first.join();
  second.join();
  for (int rank = 0; rank < 2; ++rank) {
    const int other = 1 - rank;
    ASSERT_EQ(results[rank].ring.size(), static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(results[rank].ring[i], static_cast<float>(other * 1000 + i));  // the previous
      for (int from = 0; from < 2; ++from) {  // block `from` came from member `from`
        EXPECT_EQ(results[rank].blocks[from * count + i],
                  static_cast<float>(10000 * from + 100 * rank + i));
      }
    }
    for (int from = 0; from < 2; ++from) {
      for (int c = 0; c < 2; ++c) {
        EXPECT_EQ(results[rank].counts[from * 2 + c], from * 10 + rank * 2 + c + 1);
      }
    }
  }
}

TEST(NcclCommunicator, AGroupOfOneRingStepCopies) {
  DHELIX_REQUIRE_GPUS(1);
  CudaDeviceApi api;
  DeviceCommunicator comm(api, 1, 0, "cp", [](CommId&) {}, {.timeout_s = 60, .world_rank = 0});
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  testing::DeviceBuffer<float> in(values), out(3);
  comm.ring_exchange(in.get(), out.get(), 3, DeviceDtype::kFloat32, nullptr);
  EXPECT_EQ(out.download(), values);
}

}  // namespace
}  // namespace dhelix::cuda
