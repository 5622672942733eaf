#include "runtime/cuda/nccl_communicator.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>
#include <utility>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda {
namespace {

ncclDataType_t nccl_type(DeviceDtype dtype) {
  return dtype == DeviceDtype::kFloat32 ? ncclFloat32 : ncclBfloat16;
}

size_t count_of(int64_t count) {
  DHELIX_CHECK(count >= 0);
  return static_cast<size_t>(count);
}

}  // namespace

const char* device_dtype_name(DeviceDtype dtype) {
  return dtype == DeviceDtype::kFloat32 ? "float32" : "bfloat16";
}

DeviceCommunicator::DeviceCommunicator(const ncclUniqueId& id, int64_t size, int64_t rank,
                                       std::string name, DeviceCommOptions options)
    : size_(size), rank_(rank), name_(std::move(name)), options_(options) {
  DHELIX_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_);
  try {
    DHELIX_NCCL(ncclCommInitRank(&comm_, static_cast<int>(size_), id, static_cast<int>(rank_)));
  } catch (const Error& error) {
    throw Error(error.code(), fmt::format("{}: init: {}", describe(), error.what()));
  }
}

std::unique_ptr<DeviceCommunicator> DeviceCommunicator::create_over_mpi(MPI_Comm group,
                                                                        std::string name,
                                                                        DeviceCommOptions options) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(group, &size);
  MPI_Comm_rank(group, &rank);
  ncclUniqueId id{};
  if (rank == 0) DHELIX_NCCL(ncclGetUniqueId(&id));
  const int status = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group);
  if (status != MPI_SUCCESS) {
    throw Error(ErrorCode::kInternal,
                fmt::format("NCCL group {}: MPI_Bcast of the unique id failed ({})", name, status));
  }
  return std::make_unique<DeviceCommunicator>(id, size, rank, std::move(name), options);
}

DeviceCommunicator::~DeviceCommunicator() {
  if (!aborted_.load() && comm_ != nullptr) static_cast<void>(ncclCommDestroy(comm_));
}

std::string DeviceCommunicator::describe() const {
  std::string who = options_.world_rank >= 0 ? fmt::format("rank {}: ", options_.world_rank) : "";
  return fmt::format("{}NCCL group {} (member {} of {})", who, name_, rank_, size_);
}

void DeviceCommunicator::begin(const char* op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.load()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("{}: {}: the communicator was aborted after an earlier failure",
                            describe(), op));
  }
  last_op_ = op;
}

void DeviceCommunicator::abort_and_throw(const std::string& what) {
  std::string op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op = last_op_;
    if (!aborted_.exchange(true)) static_cast<void>(ncclCommAbort(comm_));
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("{}: {}: {} (communicator aborted)", describe(), op, what));
}

// Every enqueueing call: a synchronous failure is reported as an asynchronous one would be,
// with the group and op, and leaves the communicator aborted.
#define DHELIX_NCCL_OP(op, call)     \
  do {                               \
    begin(op);                       \
    try {                            \
      DHELIX_NCCL(call);             \
    } catch (const Error& error) {   \
      abort_and_throw(error.what()); \
    }                                \
  } while (0)

void DeviceCommunicator::all_gather(const void* in, int64_t count, DeviceDtype dtype, void* out,
                                    cudaStream_t stream) {
  DHELIX_NCCL_OP("all_gather",
                 ncclAllGather(in, out, count_of(count), nccl_type(dtype), comm_, stream));
}

void DeviceCommunicator::reduce_scatter_sum(const void* in, int64_t count, DeviceDtype dtype,
                                            void* out, cudaStream_t stream) {
  DHELIX_NCCL_OP("reduce_scatter", ncclReduceScatter(in, out, count_of(count), nccl_type(dtype),
                                                     ncclSum, comm_, stream));
}

void DeviceCommunicator::all_reduce_sum(void* inout, int64_t count, DeviceDtype dtype,
                                        cudaStream_t stream) {
  DHELIX_NCCL_OP("all_reduce", ncclAllReduce(inout, inout, count_of(count), nccl_type(dtype),
                                             ncclSum, comm_, stream));
}

void DeviceCommunicator::send(const void* data, int64_t count, DeviceDtype dtype, int64_t peer,
                              cudaStream_t stream) {
  DHELIX_CHECK(peer >= 0 && peer < size_);
  DHELIX_NCCL_OP("send", ncclSend(data, count_of(count), nccl_type(dtype), static_cast<int>(peer),
                                  comm_, stream));
}

void DeviceCommunicator::recv(void* data, int64_t count, DeviceDtype dtype, int64_t peer,
                              cudaStream_t stream) {
  DHELIX_CHECK(peer >= 0 && peer < size_);
  DHELIX_NCCL_OP("recv", ncclRecv(data, count_of(count), nccl_type(dtype), static_cast<int>(peer),
                                  comm_, stream));
}

void DeviceCommunicator::group_start() { DHELIX_NCCL_OP("group_start", ncclGroupStart()); }

void DeviceCommunicator::group_end() { DHELIX_NCCL_OP("group_end", ncclGroupEnd()); }

#undef DHELIX_NCCL_OP

void DeviceCommunicator::poll() {
  if (aborted_.load()) return;
  ncclResult_t async_error = ncclSuccess;
  ncclResult_t result = ncclCommGetAsyncError(comm_, &async_error);
  if (result != ncclSuccess) async_error = result;
  if (async_error == ncclSuccess || async_error == ncclInProgress) return;
  abort_and_throw(
      fmt::format("{}: {}", nccl_result_name(async_error), ncclGetErrorString(async_error)));
}

void DeviceCommunicator::wait(cudaStream_t stream) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) {
      abort_and_throw(fmt::format("the stream failed: {}: {}", cudaGetErrorName(state),
                                  cudaGetErrorString(state)));
    }
    poll();
    const double waited_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited_s > options_.timeout_s) {
      abort_and_throw(fmt::format("timed out after {:.0f} s", options_.timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace dhelix::cuda
