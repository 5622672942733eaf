#pragma once
// A fake DeviceApi (runtime/cuda/device_api.h) that does nothing but record every call in
// order, as ninja's tests fake their disk: with it, the set-up, the CUDA executor and the
// teardown of every rank of a job run on a machine without a GPU, and tests assert the
// order of what they would have asked of CUDA, NCCL and cuBLAS. Handles are small
// integers (1, 2, ...) in pointer clothing; every stream is always "done".
//
// Faults for the hang tests (stick_stream, fail_comm, block_sends): a stream that never
// finishes, a communicator with an asynchronous error, an NCCL send that blocks the host
// until its communicator is aborted. The executor's enqueue watchdog polls the
// communicators from a thread of its own: those polls are counted (background_polls), not
// logged, since where they fall among the enqueueing thread's calls is a matter of timing
// (its aborts, which only a failing run makes, are logged).
//
// RecordingBackend (recording_backend.h) adds the model's kernel launches and GEMMs to the
// same log, so one run's record holds the whole story.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda/device_api.h"

namespace dhelix::cuda::testing {

/// One recorded call.
struct DeviceCall {
  enum class Kind {
    kCreateStream,  // value: 1 high priority, 0 not
    kDestroyStream,
    kCreateEvent,  // value: 1 timing
    kDestroyEvent,
    kRecord,  // event on stream
    kWait,    // stream waits on event
    kQuery,
    kElapsed,
    kSynchronize,
    kDelay,
    kLoadKernels,
    kStackLimit,        // value: bytes
    kWarmGemm,          // gemm on stream
    kPrepareAttention,  // on stream, label: the shape, value: 1 deterministic
    kUniqueId,
    kCommInit,  // comm, label
    kCommDestroy,
    kCommAbort,
    kCollective,  // comm on stream, value: CollectiveOp
    kSend,        // comm on stream, value: peer, count, dtype, address: data
    kRecv,        // comm on stream, value: peer, count, dtype, address: data
    kGroupStart,  // ncclGroupStart
    kGroupEnd,    // ncclGroupEnd
    kCopy,        // on stream, count: bytes, address: destination, value: source
    kAsyncError,
    kAllocate,
    kFree,
    kZero,    // on stream, count: bytes, address: the buffer (zero_async)
    kKernel,  // label: kernel, on stream (RecordingBackend)
    kGemm,    // gemm on stream (RecordingBackend)
    kMark,    // label: the test's own marker
  };
  Kind kind = Kind::kMark;
  int64_t stream = 0;  ///< 0: none
  int64_t event = 0;
  int64_t comm = 0;
  int64_t value = 0;
  int64_t count = 0;    ///< elements of a send or receive, bytes of a copy
  int64_t address = 0;  ///< the buffer of a send or receive, a copy's destination
  DeviceDtype dtype = DeviceDtype::kFloat32;
  std::string label;
  GemmShape gemm;
};
const char* device_call_name(DeviceCall::Kind kind);

class RecordingDevice final : public DeviceApi {
 public:
  /// kernel_stack_bytes: what load_kernels reports as the largest kernel's stack.
  explicit RecordingDevice(int64_t kernel_stack_bytes = 4096)
      : kernel_stack_bytes_(kernel_stack_bytes) {}

  const std::vector<DeviceCall>& calls() const { return calls_; }
  /// comm_async_error calls made by other threads than the device's (not in calls()).
  int64_t background_polls() const { return background_polls_.load(); }
  /// Stream `stream` (its id) never finishes: stream_done says false for ever; event_done
  /// says true for the first `records_done` events recorded on it from now on, false for the
  /// later ones (the stream got stuck between the two).
  void stick_stream(int64_t stream, int64_t records_done = 0) {
    stuck_streams_[stream] = records_done;
  }
  /// comm_async_error reports `error` for communicator `comm` (its id) from now on.
  void fail_comm(int64_t comm, const std::string& error) {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_errors_[comm] = error;
  }
  /// Every later send blocks the host until its communicator is aborted, as an NCCL call
  /// waiting for a dead peer does; after `max_seconds` it throws "send blocked for ..."
  /// instead (so that a test of a missing abort fails rather than hangs).
  void block_sends(double max_seconds) { block_sends_s_ = max_seconds; }
  /// Records an allocation of model memory (RecordingBackend::Memory), as kAllocate.
  void note_allocation(int64_t bytes) {
    DeviceCall call;
    call.kind = DeviceCall::Kind::kAllocate;
    call.value = bytes;
    add(std::move(call));
  }
  /// Adds a marker ("iteration 1") to the log.
  void mark(const std::string& label) {
    DeviceCall call;
    call.kind = DeviceCall::Kind::kMark;
    call.label = label;
    add(std::move(call));
  }
  /// Model ops (RecordingBackend) record through these.
  void kernel(const std::string& name, StreamHandle stream);
  void gemm(const GemmShape& shape, StreamHandle stream);

  static int64_t id(const void* handle) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(handle));
  }

  StreamHandle create_stream(bool high_priority) override;
  void destroy_stream(StreamHandle stream) noexcept override;
  EventHandle create_event(bool timing) override;
  void destroy_event(EventHandle event) noexcept override;
  void record_event(EventHandle event, StreamHandle stream) override;
  void wait_event(StreamHandle stream, EventHandle event) override;
  bool stream_done(StreamHandle stream) override;
  /// Recorded as kQuery with the event; false when its last record was on a stuck stream.
  bool event_done(EventHandle event) override;
  double elapsed_ms(EventHandle start, EventHandle end) override;
  void copy_device(void* destination, const void* source, int64_t bytes,
                   StreamHandle stream) override;
  void synchronize_device() override;
  void delay(int64_t microseconds, StreamHandle stream) override;
  KernelInventory load_kernels() override;
  void set_stack_limit(int64_t bytes_per_thread) override;
  void warm_gemm(const GemmShape& shape, StreamHandle stream) override;
  /// Records the call and decides as a build without cuDNN would (dhelix's kernel).
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
  int64_t internal_streams_per_comm() const override { return 2; }
  void* allocate_scratch(int64_t bytes) override;
  void zero_async(void* data, int64_t bytes, StreamHandle stream) override;
  void free_scratch(void* pointer) noexcept override;

 private:
  void add(DeviceCall call) {
    if (call.kind == DeviceCall::Kind::kAsyncError && std::this_thread::get_id() != owner_) {
      ++background_polls_;
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.push_back(std::move(call));
  }
  template <class Handle>
  static Handle handle(int64_t id) {
    return reinterpret_cast<Handle>(static_cast<uintptr_t>(id));
  }

  int64_t kernel_stack_bytes_;
  int64_t next_stream_ = 1;
  int64_t next_event_ = 1;
  int64_t next_comm_ = 1;
  std::vector<std::vector<char>> scratch_;
  std::vector<DeviceCall> calls_;
  std::mutex mutex_;                          // guards calls_, comm_errors_ and aborted_
  std::map<int64_t, int64_t> stuck_streams_;  // stream -> records still to finish
  std::map<int64_t, bool> event_stuck_;       // event -> whether its last record is stuck
  std::map<int64_t, std::string> comm_errors_;
  std::set<int64_t> aborted_;
  std::thread::id owner_ = std::this_thread::get_id();
  std::atomic<int64_t> background_polls_{0};
  double block_sends_s_ = 0;  // 0: sends do not block
};

}  // namespace dhelix::cuda::testing
