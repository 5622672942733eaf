#include "runtime/cuda/cuda_device_api.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/attention_self_check.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/cuda/moe_shared_cuda.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/cuda/stream_scratch.h"

namespace dhelix::cuda {
namespace {

cudaStream_t cuda_of(StreamHandle stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t cuda_of(EventHandle event) { return reinterpret_cast<cudaEvent_t>(event); }
ncclComm_t nccl_of(CommHandle comm) { return reinterpret_cast<ncclComm_t>(comm); }

ncclDataType_t nccl_type(DeviceDtype dtype) {
  switch (dtype) {
    case DeviceDtype::kFloat32:
      return ncclFloat32;
    case DeviceDtype::kBFloat16:
      return ncclBfloat16;
    case DeviceDtype::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

size_t count_of(int64_t count) {
  DHELIX_CHECK(count >= 0);
  return static_cast<size_t>(count);
}

}  // namespace

CudaDeviceApi::CudaDeviceApi() {
  DHELIX_CUDA(cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_));
}

CudaDeviceApi::~CudaDeviceApi() = default;

StreamHandle CudaDeviceApi::create_stream(bool high_priority) {
  cudaStream_t stream = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                           high_priority ? greatest_priority_ : least_priority_));
  return reinterpret_cast<StreamHandle>(stream);
}

void CudaDeviceApi::destroy_stream(StreamHandle stream) noexcept {
  // A stream's cuBLAS handle goes first; errors are ignored (a destructor must not throw,
  // and after a failure the device may refuse everything).
  gemms_.erase(stream);
  static_cast<void>(cudaStreamDestroy(cuda_of(stream)));
}

EventHandle CudaDeviceApi::create_event(bool timing) {
  cudaEvent_t event = nullptr;
  DHELIX_CUDA(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return reinterpret_cast<EventHandle>(event);
}

void CudaDeviceApi::destroy_event(EventHandle event) noexcept {
  static_cast<void>(cudaEventDestroy(cuda_of(event)));
}

void CudaDeviceApi::record_event(EventHandle event, StreamHandle stream) {
  DHELIX_CUDA(cudaEventRecord(cuda_of(event), cuda_of(stream)));
}

void CudaDeviceApi::wait_event(StreamHandle stream, EventHandle event) {
  DHELIX_CUDA(cudaStreamWaitEvent(cuda_of(stream), cuda_of(event), 0));
}

bool CudaDeviceApi::stream_done(StreamHandle stream) {
  const cudaError_t status = cudaStreamQuery(cuda_of(stream));
  if (status == cudaErrorNotReady) return false;
  DHELIX_CUDA(status);
  return true;
}

bool CudaDeviceApi::event_done(EventHandle event) {
  const cudaError_t status = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  DHELIX_CUDA(status);
  return true;
}

double CudaDeviceApi::elapsed_ms(EventHandle start, EventHandle end) {
  float ms = 0;
  DHELIX_CUDA(cudaEventElapsedTime(&ms, cuda_of(start), cuda_of(end)));
  return static_cast<double>(ms);
}

void CudaDeviceApi::synchronize_device() { DHELIX_CUDA(cudaDeviceSynchronize()); }

void CudaDeviceApi::delay(int64_t microseconds, StreamHandle stream) {
  cuda::delay(microseconds, cuda_of(stream));
}

KernelInventory CudaDeviceApi::load_kernels() {
  KernelInventory inventory;
  for (const auto& list :
       {rowwise_kernels(), embedding_kernels(), attention_kernels(), ring_attention_kernels(),
        moe_kernels(), moe_shared_kernels(), delay_kernels()}) {
    for (const KernelEntry& kernel : list) {
      cudaFuncAttributes attributes{};
      try {
        DHELIX_CUDA(cudaFuncGetAttributes(&attributes, kernel.function));
      } catch (const Error& error) {
        throw Error(error.code(), fmt::format("loading kernel {}: {}", kernel.name, error.what()));
      }
      ++inventory.kernels;
      if (static_cast<int64_t>(attributes.localSizeBytes) > inventory.max_stack_bytes) {
        inventory.max_stack_bytes = static_cast<int64_t>(attributes.localSizeBytes);
        inventory.largest_stack_kernel = kernel.name;
      }
    }
  }
  return inventory;
}

void CudaDeviceApi::set_stack_limit(int64_t bytes_per_thread) {
  size_t current = 0;
  DHELIX_CUDA(cudaDeviceGetLimit(&current, cudaLimitStackSize));
  if (static_cast<int64_t>(current) >= bytes_per_thread) return;
  DHELIX_CUDA(cudaDeviceSetLimit(cudaLimitStackSize, static_cast<size_t>(bytes_per_thread)));
}

CublasGemm& CudaDeviceApi::gemm_for(StreamHandle stream) {
  auto& gemm = gemms_[stream];
  if (!gemm) gemm = std::make_unique<CublasGemm>(cuda_of(stream));
  return *gemm;
}

void CudaDeviceApi::warm_gemm(const GemmShape& shape, StreamHandle stream) {
  // Packed operands as the call reads them: A [m, k], B [k, n], C [m, n]; the same call
  // (beta included) as the iteration's (cublas_gemm.h, enqueue_gemm).
  // Zeroed on the GEMM's own stream (stream_scratch.h: not the legacy stream).
  StreamScratch a(*this, shape.m * shape.k * 2, stream);
  StreamScratch b(*this, shape.k * shape.n * 2, stream);
  StreamScratch c(*this, shape.m * shape.n * (shape.fp32_output ? 4 : 2), stream);
  gemm_for(stream).run(shape, a.as<__nv_bfloat16>(), b.as<__nv_bfloat16>(), c.as<void>());
  // The scratch goes when this returns: wait for the GEMM (set-up, not an iteration).
  DHELIX_CUDA(cudaStreamSynchronize(cuda_of(stream)));
}

AttentionDecision CudaDeviceApi::prepare_attention(const AttentionSetup& setup,
                                                   StreamHandle stream) {
  if (!sdpa_) {
    sdpa_ = setup.choice == AttentionChoice::kDhelix ? missing_cudnn("DHELIX_ATTENTION=dhelix")
                                                     : CudnnSdpa::load();
  }
  const AttentionDecision decision = prepare_attention_path(*this, *sdpa_, setup, stream);
  use_cudnn_ = decision.path == AttentionPath::kCudnn;
  return decision;
}

CommId CudaDeviceApi::comm_unique_id() {
  ncclUniqueId id{};
  DHELIX_NCCL(ncclGetUniqueId(&id));
  CommId out{};
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

CommHandle CudaDeviceApi::comm_init(const CommId& id, int64_t size, int64_t rank,
                                    const std::string& /*label*/, int64_t max_ctas) {
  return nccl_comm_init(id, size, rank, max_ctas);
}

CommHandle nccl_comm_init(const CommId& id, int64_t size, int64_t rank, int64_t max_ctas) {
  ncclUniqueId nccl_id{};
  std::memcpy(&nccl_id, id.data(), sizeof(nccl_id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (max_ctas > 0) {
    config.minCTAs = 1;
    config.maxCTAs = static_cast<int>(max_ctas);
  }
  ncclComm_t comm = nullptr;
  DHELIX_NCCL(ncclCommInitRankConfig(&comm, static_cast<int>(size), nccl_id, static_cast<int>(rank),
                                     &config));
  return reinterpret_cast<CommHandle>(comm);
}

void CudaDeviceApi::comm_destroy(CommHandle comm) noexcept {
  static_cast<void>(ncclCommDestroy(nccl_of(comm)));
}

void CudaDeviceApi::comm_abort(CommHandle comm) noexcept {
  static_cast<void>(ncclCommAbort(nccl_of(comm)));
}

void CudaDeviceApi::collective(CommHandle comm, CollectiveOp op, const void* in, void* out,
                               int64_t count, DeviceDtype dtype, StreamHandle stream) {
  switch (op) {
    case CollectiveOp::kAllGather:
      DHELIX_NCCL(ncclAllGather(in, out, count_of(count), nccl_type(dtype), nccl_of(comm),
                                cuda_of(stream)));
      return;
    case CollectiveOp::kReduceScatterSum:
      DHELIX_NCCL(ncclReduceScatter(in, out, count_of(count), nccl_type(dtype), ncclSum,
                                    nccl_of(comm), cuda_of(stream)));
      return;
    case CollectiveOp::kAllReduceSum:
      DHELIX_NCCL(ncclAllReduce(in, out, count_of(count), nccl_type(dtype), ncclSum, nccl_of(comm),
                                cuda_of(stream)));
      return;
  }
}

void CudaDeviceApi::send(CommHandle comm, const void* data, int64_t count, DeviceDtype dtype,
                         int64_t peer, StreamHandle stream) {
  DHELIX_NCCL(ncclSend(data, count_of(count), nccl_type(dtype), static_cast<int>(peer),
                       nccl_of(comm), cuda_of(stream)));
}

void CudaDeviceApi::recv(CommHandle comm, void* data, int64_t count, DeviceDtype dtype,
                         int64_t peer, StreamHandle stream) {
  DHELIX_NCCL(ncclRecv(data, count_of(count), nccl_type(dtype), static_cast<int>(peer),
                       nccl_of(comm), cuda_of(stream)));
}

void CudaDeviceApi::group_start() { DHELIX_NCCL(ncclGroupStart()); }

void CudaDeviceApi::group_end() { DHELIX_NCCL(ncclGroupEnd()); }

void CudaDeviceApi::copy_device(void* destination, const void* source, int64_t bytes,
                                StreamHandle stream) {
  if (bytes <= 0) return;
  DHELIX_CUDA(cudaMemcpyAsync(destination, source, static_cast<size_t>(bytes),
                              cudaMemcpyDeviceToDevice, cuda_of(stream)));
}

std::optional<std::string> CudaDeviceApi::comm_async_error(CommHandle comm) {
  ncclResult_t async_error = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(nccl_of(comm), &async_error);
  if (result != ncclSuccess) async_error = result;
  if (async_error == ncclSuccess || async_error == ncclInProgress) return std::nullopt;
  return fmt::format("{}: {}", nccl_result_name(async_error), ncclGetErrorString(async_error));
}

void* CudaDeviceApi::allocate_scratch(int64_t bytes) {
  void* pointer = nullptr;
  DHELIX_CUDA(cudaMalloc(&pointer, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return pointer;
}

void CudaDeviceApi::zero_async(void* data, int64_t bytes, StreamHandle stream) {
  DHELIX_CUDA(cudaMemsetAsync(data, 0, count_of(bytes), cuda_of(stream)));
}

void CudaDeviceApi::free_scratch(void* pointer) noexcept {
  if (pointer != nullptr) static_cast<void>(cudaFree(pointer));
}

}  // namespace dhelix::cuda
