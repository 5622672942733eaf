#pragma once
// The thin interface through which the CUDA executor and the device set-up reach CUDA,
// NCCL and cuBLAS (ninja reaches its disk through DiskInterface the same way). Two
// implementations exist:
//   CudaDeviceApi (runtime/cuda/cuda_device_api.h): the libraries themselves, every return
//       code checked by the one wrapper of its library (runtime/cuda/cuda_check.h; cuDNN's
//       in runtime/cuda/cudnn_sdpa.cc);
//   RecordingDevice (tests/gpu/recording_device.h): records every call in order and does
//       nothing, so that the host logic of a multi-rank run (set-up order, event order, no
//       host wait inside an iteration, destroy order) is tested on a machine without a GPU.
// Nothing here includes a CUDA header: handles are opaque pointers the implementation casts
// back to its own types, so the executor, the streams, the communicators and their tests
// build with or without the toolkit.
//
// Every call either succeeds or throws dhelix::Error naming the call and the library's own
// error text; the destroy calls never throw (they run in destructors).

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/cuda/attention_path.h"

namespace dhelix::cuda {

struct OpaqueStream;
struct OpaqueEvent;
struct OpaqueComm;
/// A cudaStream_t, cudaEvent_t or ncclComm_t as the executor holds it.
using StreamHandle = OpaqueStream*;
using EventHandle = OpaqueEvent*;
using CommHandle = OpaqueComm*;

/// Element type of a transfer or collective (kInt64: the all-to-all's per-peer counts).
enum class DeviceDtype { kFloat32, kBFloat16, kInt64 };
const char* device_dtype_name(DeviceDtype dtype);  ///< "float32", "bfloat16", "int64"
/// Bytes of one element.
int64_t device_dtype_bytes(DeviceDtype dtype);

/// ncclUniqueId's 128 bytes.
using CommId = std::array<char, 128>;

/// One cuBLAS GEMM exactly as runtime/cuda issues it (CublasGemm::run, cublas_gemm.h):
/// row-major C[m, n] = op(A)[m, k] op(B)[k, n] + beta C on packed operands, bf16 inputs,
/// fp32 accumulation, C bf16 or fp32 (weight gradients), beta 1 when accumulating (weight
/// gradients over micro-batches) else 0. The set-up warms each shape (cuBLAS loads, and its
/// heuristics pick, a kernel per call description on first use) and dhelix-profile times
/// these same calls (profiler/cuda/cuda_op_plan.h), so all three agree on the kernel.
struct GemmShape {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool fp32_output = false;
  bool accumulate = false;  ///< beta = 1
  auto operator<=>(const GemmShape&) const = default;
};

/// What loading every dhelix kernel found.
struct KernelInventory {
  int64_t kernels = 0;               ///< kernels loaded
  int64_t max_stack_bytes = 0;       ///< largest per-thread local memory (stack) of any
  std::string largest_stack_kernel;  ///< its name
};

/// The collective a DeviceCommunicator enqueues.
enum class CollectiveOp { kAllGather, kReduceScatterSum, kAllReduceSum };

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // ---- CUDA runtime: streams and events -------------------------------------------
  /// A non-blocking stream at the device's greatest priority (high) or its least.
  virtual StreamHandle create_stream(bool high_priority) = 0;
  virtual void destroy_stream(StreamHandle stream) noexcept = 0;
  /// An event; timing events only for the iteration's wall time.
  virtual EventHandle create_event(bool timing) = 0;
  virtual void destroy_event(EventHandle event) noexcept = 0;
  /// cudaEventRecord(event, stream).
  virtual void record_event(EventHandle event, StreamHandle stream) = 0;
  /// cudaStreamWaitEvent(stream, event): device-side; the host does not wait.
  virtual void wait_event(StreamHandle stream, EventHandle event) = 0;
  /// cudaStreamQuery: true when every operation on the stream has finished; throws on a
  /// failed stream. Never blocks.
  virtual bool stream_done(StreamHandle stream) = 0;
  /// cudaEventQuery: true once the work captured by the event's last record has finished
  /// (or it was never recorded); throws on a failed stream. Never blocks. For hang reports.
  virtual bool event_done(EventHandle event) = 0;
  /// Milliseconds between two recorded timing events (both finished).
  virtual double elapsed_ms(EventHandle start, EventHandle end) = 0;
  /// cudaMemcpyAsync(destination, source, bytes, device to device) on `stream`: the ring
  /// step of a group of one (its "next member" is itself).
  virtual void copy_device(void* destination, const void* source, int64_t bytes,
                           StreamHandle stream) = 0;
  /// cudaDeviceSynchronize: a host wait, for set-up and between iterations only.
  virtual void synchronize_device() = 0;
  /// Holds `stream` about `microseconds` (dhelix-run --jitter-us).
  virtual void delay(int64_t microseconds, StreamHandle stream) = 0;

  // ---- Set-up that must precede every receive (docs/gpu.md, "iteration 1") ----------
  /// Loads every dhelix kernel into the context (cudaFuncGetAttributes on each: under
  /// lazy loading that is the load) and reports their stack needs.
  virtual KernelInventory load_kernels() = 0;
  /// cudaDeviceSetLimit(cudaLimitStackSize, bytes_per_thread).
  virtual void set_stack_limit(int64_t bytes_per_thread) = 0;
  /// Runs `shape` once on `stream` (scratch operands, the handle of `stream`).
  virtual void warm_gemm(const GemmShape& shape, StreamHandle stream) = 0;
  /// Decides which attention the rank runs (attention_path.h, steps 1-3: cuDNN's plans
  /// for setup.shape built, the self-check run on `stream`) and remembers it for the model.
  /// Like warm_gemm, it loads (or compiles) every attention kernel before any receive.
  virtual AttentionDecision prepare_attention(const AttentionSetup& setup, StreamHandle stream) = 0;

  // ---- NCCL -----------------------------------------------------------------------
  /// ncclGetUniqueId (member 0 of a group only).
  virtual CommId comm_unique_id() = 0;
  /// ncclCommInitRankConfig; `label` names the group in errors and records. max_ctas > 0
  /// caps the thread blocks (SMs) each of the communicator's kernels may occupy
  /// (ncclConfig_t::maxCTAs); 0 leaves NCCL's default.
  virtual CommHandle comm_init(const CommId& id, int64_t size, int64_t rank,
                               const std::string& label, int64_t max_ctas) = 0;
  /// ncclCommDestroy: collective over the members (docs/gpu.md, "destroy order").
  virtual void comm_destroy(CommHandle comm) noexcept = 0;
  /// ncclCommAbort: local; also ends kernels waiting for a peer.
  virtual void comm_abort(CommHandle comm) noexcept = 0;
  /// Enqueues a collective: in[count] (all_reduce: in == out) or, for reduce_scatter,
  /// in[size * count]; out[size * count] for all_gather.
  virtual void collective(CommHandle comm, CollectiveOp op, const void* in, void* out,
                          int64_t count, DeviceDtype dtype, StreamHandle stream) = 0;
  virtual void send(CommHandle comm, const void* data, int64_t count, DeviceDtype dtype,
                    int64_t peer, StreamHandle stream) = 0;
  virtual void recv(CommHandle comm, void* data, int64_t count, DeviceDtype dtype, int64_t peer,
                    StreamHandle stream) = 0;
  /// ncclGroupStart / ncclGroupEnd: the sends and receives enqueued between them (on any
  /// of the rank's communicators) are issued as one operation, so that a member's send to
  /// a peer and its receive from another cannot wait for each other (NCCL documentation,
  /// "Group Calls": point-to-point calls of a ring or an all-to-all must be grouped, or
  /// they deadlock). Every member of a group must make the same grouped calls in the same
  /// order on its communicator.
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  /// ncclCommGetAsyncError: nullopt while healthy (or in progress), else the error's name
  /// and text.
  virtual std::optional<std::string> comm_async_error(CommHandle comm) = 0;
  /// CUDA streams a communicator keeps for itself, each one more hardware queue user
  /// (docs/gpu.md, "hardware queues").
  virtual int64_t internal_streams_per_comm() const = 0;

  // ---- Memory for set-up scratch ----------------------------------------------------
  /// cudaMalloc / cudaFree of a small scratch buffer (warm-ups).
  virtual void* allocate_scratch(int64_t bytes) = 0;
  /// cudaMemsetAsync(data, 0, bytes, stream): stream-ordered, never on the legacy stream,
  /// which the rank's non-blocking streams do not wait for (stream_scratch.h).
  virtual void zero_async(void* data, int64_t bytes, StreamHandle stream) = 0;
  virtual void free_scratch(void* pointer) noexcept = 0;
};

}  // namespace dhelix::cuda
