#pragma once
// DeviceApi (runtime/cuda/device_api.h) over the real libraries: the CUDA runtime, NCCL and
// cuBLAS, every return code through the one wrapper of its library (cuda_check.h). Handles
// are the libraries' own (cudaStream_t, cudaEvent_t, ncclComm_t) cast to the opaque types.
//
// Stack. load_kernels() asks cudaFuncGetAttributes for every dhelix kernel: under lazy
// loading (CUDA 12.2+ default) that call loads the kernel's module, so no later launch
// loads one while NCCL kernels spin (CUDA Programming Guide, "Lazy Loading": a module
// loaded lazily may need a context synchronisation). localSizeBytes is the kernel's
// per-thread local memory (the stack, for dhelix's kernels: no recursion, no alloca).
//
// GEMM warm-up. warm_gemm() runs the shape once on the stream's handle with zeroed
// scratch operands: cuBLAS picks, loads and caches its kernel for the shape then, not in
// the middle of an iteration.
//
// Attention. prepare_attention() opens cuDNN (cudnn_sdpa.h), builds its plans for the job's
// shape and runs the self-check (attention_self_check.h); cudnn_attention() then hands the
// model the cuDNN runner when cuDNN was chosen, nullptr when dhelix's kernel was.

#include <map>
#include <memory>

#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

class CublasGemm;

/// ncclCommInitRankConfig of member `rank` of `size` with id `id`, its blocks capped at
/// `max_ctas` (ncclConfig_t::maxCTAs; 0: NCCL's default): the ncclComm_t as a CommHandle.
/// CudaDeviceApi::comm_init and dhelix-profile's communicators both make theirs here, so
/// that a profiled collective runs with the runtime's configuration
/// (device_comms.h, runtime_max_ctas).
CommHandle nccl_comm_init(const CommId& id, int64_t size, int64_t rank, int64_t max_ctas);

/// CUDA streams NCCL 2.x keeps per communicator for its own work (its proxy's host stream
/// and its device-side stream). Not a documented constant: the review of docs/gpu.md,
/// "hardware queues", counts them as NCCL's source does; an over-count only makes the
/// connection check stricter.
inline constexpr int64_t kNcclStreamsPerComm = 2;

class CudaDeviceApi final : public DeviceApi {
 public:
  CudaDeviceApi();
  ~CudaDeviceApi() override;
  CudaDeviceApi(const CudaDeviceApi&) = delete;
  CudaDeviceApi& operator=(const CudaDeviceApi&) = delete;

  StreamHandle create_stream(bool high_priority) override;
  void destroy_stream(StreamHandle stream) noexcept override;
  EventHandle create_event(bool timing) override;
  void destroy_event(EventHandle event) noexcept override;
  void record_event(EventHandle event, StreamHandle stream) override;
  void wait_event(StreamHandle stream, EventHandle event) override;
  bool stream_done(StreamHandle stream) override;
  bool event_done(EventHandle event) override;
  double elapsed_ms(EventHandle start, EventHandle end) override;
  void copy_device(void* destination, const void* source, int64_t bytes,
                   StreamHandle stream) override;
  void synchronize_device() override;
  void delay(int64_t microseconds, StreamHandle stream) override;

  KernelInventory load_kernels() override;
  void set_stack_limit(int64_t bytes_per_thread) override;
  void warm_gemm(const GemmShape& shape, StreamHandle stream) override;
  AttentionDecision prepare_attention(const AttentionSetup& setup, StreamHandle stream) override;

  CommId comm_unique_id() override;
  CommHandle comm_init(const CommId& id, int64_t size, int64_t rank, const std::string& label,
                       int64_t max_ctas) override;
  void comm_destroy(CommHandle comm) noexcept override;
  void comm_abort(CommHandle comm) noexcept override;
  void collective(CommHandle comm, CollectiveOp op, const void* in, void* out, int64_t count,
                  DeviceDtype dtype, StreamHandle stream) override;
  void send(CommHandle comm, const void* data, int64_t count, DeviceDtype dtype, int64_t peer,
            StreamHandle stream) override;
  void recv(CommHandle comm, void* data, int64_t count, DeviceDtype dtype, int64_t peer,
            StreamHandle stream) override;
  void group_start() override;
  void group_end() override;
  std::optional<std::string> comm_async_error(CommHandle comm) override;
  int64_t internal_streams_per_comm() const override { return kNcclStreamsPerComm; }

  void* allocate_scratch(int64_t bytes) override;
  void zero_async(void* data, int64_t bytes, StreamHandle stream) override;
  void free_scratch(void* pointer) noexcept override;

  /// The cuBLAS handle bound to `stream` (made on first use): the one warm_gemm warms and
  /// the executor's compute ops use.
  CublasGemm& gemm_for(StreamHandle stream);
  /// cuDNN's attention when prepare_attention chose it, else nullptr.
  CudnnSdpa* cudnn_attention() { return use_cudnn_ ? sdpa_.get() : nullptr; }

 private:
  int least_priority_ = 0;
  int greatest_priority_ = 0;
  std::map<StreamHandle, std::unique_ptr<CublasGemm>> gemms_;  // one handle per stream
  std::unique_ptr<CudnnSdpa> sdpa_;
  bool use_cudnn_ = false;
};

}  // namespace dhelix::cuda
