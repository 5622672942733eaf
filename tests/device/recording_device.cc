#include "tests/device/recording_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "lib/error.h"

namespace dhelix::cuda::testing {

using Kind = DeviceCall::Kind;

const char* device_call_name(Kind kind) {
  switch (kind) {
    case Kind::kCreateStream:
      return "create_stream";
    case Kind::kDestroyStream:
      return "destroy_stream";
    case Kind::kCreateEvent:
      return "create_event";
    case Kind::kDestroyEvent:
      return "destroy_event";
    case Kind::kRecord:
      return "record";
    case Kind::kWait:
      return "wait";
    case Kind::kQuery:
      return "query";
    case Kind::kElapsed:
      return "elapsed";
    case Kind::kSynchronize:
      return "synchronize";
    case Kind::kDelay:
      return "delay";
    case Kind::kLoadKernels:
      return "load_kernels";
    case Kind::kStackLimit:
      return "stack_limit";
    case Kind::kWarmGemm:
      return "warm_gemm";
    case Kind::kPrepareAttention:
      return "prepare_attention";
    case Kind::kUniqueId:
      return "unique_id";
    case Kind::kCommInit:
      return "comm_init";
    case Kind::kCommDestroy:
      return "comm_destroy";
    case Kind::kCommAbort:
      return "comm_abort";
    case Kind::kCollective:
      return "collective";
    case Kind::kSend:
      return "send";
    case Kind::kRecv:
      return "recv";
    case Kind::kGroupStart:
      return "group_start";
    case Kind::kGroupEnd:
      return "group_end";
    case Kind::kCopy:
      return "copy";
    case Kind::kAsyncError:
      return "async_error";
    case Kind::kAllocate:
      return "allocate";
    case Kind::kZero:
      return "zero";
    case Kind::kFree:
      return "free";
    case Kind::kKernel:
      return "kernel";
    case Kind::kGemm:
      return "gemm";
    case Kind::kMark:
      return "mark";
  }
  return "?";
}

void RecordingDevice::kernel(const std::string& name, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kKernel;
    call.stream = id(stream);
    call.label = name;
    add(std::move(call));
  }
}

void RecordingDevice::gemm(const GemmShape& shape, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kGemm;
    call.stream = id(stream);
    call.gemm = shape;
    add(std::move(call));
  }
}

StreamHandle RecordingDevice::create_stream(bool high_priority) {
  const int64_t stream = next_stream_++;
  {
    DeviceCall call;
    call.kind = Kind::kCreateStream;
    call.stream = stream;
    call.value = high_priority ? 1 : 0;
    add(std::move(call));
  }
  return handle<StreamHandle>(stream);
}

void RecordingDevice::destroy_stream(StreamHandle stream) noexcept {
  {
    DeviceCall call;
    call.kind = Kind::kDestroyStream;
    call.stream = id(stream);
    add(std::move(call));
  }
}

EventHandle RecordingDevice::create_event(bool timing) {
  const int64_t event = next_event_++;
  {
    DeviceCall call;
    call.kind = Kind::kCreateEvent;
    call.event = event;
    call.value = timing ? 1 : 0;
    add(std::move(call));
  }
  return handle<EventHandle>(event);
}

void RecordingDevice::destroy_event(EventHandle event) noexcept {
  {
    DeviceCall call;
    call.kind = Kind::kDestroyEvent;
    call.event = id(event);
    add(std::move(call));
  }
}

void RecordingDevice::record_event(EventHandle event, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kRecord;
    call.stream = id(stream);
    call.event = id(event);
    add(std::move(call));
  }
  const auto stuck = stuck_streams_.find(id(stream));
  event_stuck_[id(event)] = stuck != stuck_streams_.end() && stuck->second-- <= 0;
}

bool RecordingDevice::event_done(EventHandle event) {
  {
    DeviceCall call;
    call.kind = Kind::kQuery;
    call.event = id(event);
    add(std::move(call));
  }
  const auto stuck = event_stuck_.find(id(event));
  return stuck == event_stuck_.end() || !stuck->second;
}

void RecordingDevice::wait_event(StreamHandle stream, EventHandle event) {
  {
    DeviceCall call;
    call.kind = Kind::kWait;
    call.stream = id(stream);
    call.event = id(event);
    add(std::move(call));
  }
}

bool RecordingDevice::stream_done(StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kQuery;
    call.stream = id(stream);
    add(std::move(call));
  }
  return !stuck_streams_.contains(id(stream));
}

double RecordingDevice::elapsed_ms(EventHandle start, EventHandle end) {
  {
    DeviceCall call;
    call.kind = Kind::kElapsed;
    call.event = id(start);
    call.value = id(end);
    add(std::move(call));
  }
  return 1.0;
}

void RecordingDevice::synchronize_device() {
  {
    DeviceCall call;
    call.kind = Kind::kSynchronize;
    add(std::move(call));
  }
}

void RecordingDevice::delay(int64_t microseconds, StreamHandle stream) {
  if (microseconds > 0) {
    DeviceCall call;
    call.kind = Kind::kDelay;
    call.stream = id(stream);
    call.value = microseconds;
    add(std::move(call));
  }
}

KernelInventory RecordingDevice::load_kernels() {
  {
    DeviceCall call;
    call.kind = Kind::kLoadKernels;
    add(std::move(call));
  }
  return {.kernels = 1, .max_stack_bytes = kernel_stack_bytes_, .largest_stack_kernel = "fake"};
}

void RecordingDevice::set_stack_limit(int64_t bytes_per_thread) {
  {
    DeviceCall call;
    call.kind = Kind::kStackLimit;
    call.value = bytes_per_thread;
    add(std::move(call));
  }
}

AttentionDecision RecordingDevice::prepare_attention(const AttentionSetup& setup,
                                                     StreamHandle stream) {
  DeviceCall call;
  call.kind = Kind::kPrepareAttention;
  call.stream = id(stream);
  call.value = setup.deterministic ? 1 : 0;
  const kernels::AttentionShape& a = setup.shape;
  call.label = fmt::format("batch {} seq {} heads {} kv_heads {} head_dim {}", a.batch, a.seq,
                           a.heads, a.kv_heads, a.head_dim);
  add(std::move(call));
  return decide_attention_path(setup, AttentionFacts{});
}

void RecordingDevice::warm_gemm(const GemmShape& shape, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kWarmGemm;
    call.stream = id(stream);
    call.gemm = shape;
    add(std::move(call));
  }
}

CommId RecordingDevice::comm_unique_id() {
  {
    DeviceCall call;
    call.kind = Kind::kUniqueId;
    add(std::move(call));
  }
  return CommId{};
}

CommHandle RecordingDevice::comm_init(const CommId& /*id*/, int64_t size, int64_t rank,
                                      const std::string& label, int64_t max_ctas) {
  const int64_t comm = next_comm_++;
  {
    DeviceCall call;
    call.kind = Kind::kCommInit;
    call.comm = comm;
    call.value = max_ctas;
    call.label = label + " member " + std::to_string(rank) + " of " + std::to_string(size);
    add(std::move(call));
  }
  return handle<CommHandle>(comm);
}

void RecordingDevice::comm_destroy(CommHandle comm) noexcept {
  {
    DeviceCall call;
    call.kind = Kind::kCommDestroy;
    call.comm = id(comm);
    add(std::move(call));
  }
}

void RecordingDevice::comm_abort(CommHandle comm) noexcept {
  {
    DeviceCall call;
    call.kind = Kind::kCommAbort;
    call.comm = id(comm);
    add(std::move(call));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_.insert(id(comm));
}

void RecordingDevice::collective(CommHandle comm, CollectiveOp op, const void* /*in*/,
                                 void* /*out*/, int64_t count, DeviceDtype /*dtype*/,
                                 StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kCollective;
    call.stream = id(stream);
    call.comm = id(comm);
    call.value = static_cast<int64_t>(op);
    call.label = std::to_string(count);
    add(std::move(call));
  }
}

void RecordingDevice::send(CommHandle comm, const void* data, int64_t count, DeviceDtype dtype,
                           int64_t peer, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kSend;
    call.stream = id(stream);
    call.comm = id(comm);
    call.value = peer;
    call.count = count;
    call.dtype = dtype;
    call.address = id(data);
    add(std::move(call));
  }
  if (block_sends_s_ <= 0) return;
  // Blocked as NCCL is on a dead peer: until the communicator is aborted.
  const auto since = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_.contains(id(comm))) {
        throw Error(ErrorCode::kInternal, "ncclSend: the communicator was aborted");
      }
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count() >
        block_sends_s_) {
      throw Error(
          ErrorCode::kInternal,
          fmt::format("send blocked for {} s and nobody aborted its communicator", block_sends_s_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RecordingDevice::recv(CommHandle comm, void* data, int64_t count, DeviceDtype dtype,
                           int64_t peer, StreamHandle stream) {
  {
    DeviceCall call;
    call.kind = Kind::kRecv;
    call.stream = id(stream);
    call.comm = id(comm);
    call.value = peer;
    call.count = count;
    call.dtype = dtype;
    call.address = id(data);
    add(std::move(call));
  }
}

void RecordingDevice::group_start() {
  DeviceCall call;
  call.kind = Kind::kGroupStart;
  add(std::move(call));
}

void RecordingDevice::group_end() {
  DeviceCall call;
  call.kind = Kind::kGroupEnd;
  add(std::move(call));
}

void RecordingDevice::copy_device(void* destination, const void* source, int64_t bytes,
                                  StreamHandle stream) {
  DeviceCall call;
  call.kind = Kind::kCopy;
  call.stream = id(stream);
  call.count = bytes;
  call.address = id(destination);
  call.value = id(source);
  add(std::move(call));
}

std::optional<std::string> RecordingDevice::comm_async_error(CommHandle comm) {
  {
    DeviceCall call;
    call.kind = Kind::kAsyncError;
    call.comm = id(comm);
    add(std::move(call));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto error = comm_errors_.find(id(comm));
  if (error == comm_errors_.end()) return std::nullopt;
  return error->second;
}

void RecordingDevice::zero_async(void* data, int64_t bytes, StreamHandle stream) {
  DeviceCall call;
  call.kind = Kind::kZero;
  call.stream = id(stream);
  call.count = bytes;
  call.address = id(data);
  add(std::move(call));
}

void* RecordingDevice::allocate_scratch(int64_t bytes) {
  {
    DeviceCall call;
    call.kind = Kind::kAllocate;
    call.value = bytes;
    add(std::move(call));
  }
  scratch_.emplace_back(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  return scratch_.back().data();
}

void RecordingDevice::free_scratch(void* /*pointer*/) noexcept {
  {
    DeviceCall call;
    call.kind = Kind::kFree;
    add(std::move(call));
  }
}

}  // namespace dhelix::cuda::testing
