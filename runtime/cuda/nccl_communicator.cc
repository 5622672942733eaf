#include "runtime/cuda/nccl_communicator.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>
#include <utility>

#include "lib/error.h"

namespace dhelix::cuda {

const char* device_dtype_name(DeviceDtype dtype) {
  switch (dtype) {
    case DeviceDtype::kFloat32:
      return "float32";
    case DeviceDtype::kBFloat16:
      return "bfloat16";
    case DeviceDtype::kInt64:
      return "int64";
  }
  return "?";
}

int64_t device_dtype_bytes(DeviceDtype dtype) {
  switch (dtype) {
    case DeviceDtype::kFloat32:
      return 4;
    case DeviceDtype::kBFloat16:
      return 2;
    case DeviceDtype::kInt64:
      return 8;
  }
  return 0;
}

DeviceCommunicator::DeviceCommunicator(DeviceApi& api, int64_t size, int64_t rank, std::string name,
                                       const std::function<void(CommId&)>& share_id,
                                       DeviceCommOptions options)
    : api_(api), size_(size), rank_(rank), name_(std::move(name)), options_(options) {
  DHELIX_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_);
  if (!has_nccl()) return;  // a group of one: no NCCL communicator, no streams
  try {
    CommId id{};
    if (rank_ == 0) id = api_.comm_unique_id();
    share_id(id);
    comm_ = api_.comm_init(id, size_, rank_, name_, options_.max_ctas);
  } catch (const Error& error) {
    throw Error(error.code(), fmt::format("{}: init: {}", describe(), error.what()));
  }
}

std::unique_ptr<DeviceCommunicator> DeviceCommunicator::create_over_mpi(DeviceApi& api,
                                                                        MPI_Comm group,
                                                                        std::string name,
                                                                        DeviceCommOptions options) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(group, &size);
  MPI_Comm_rank(group, &rank);
  // A group of one shares nothing (its constructor never asks for the id).
  const auto share_id = [&](CommId& id) {
    const int status = MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group);
    if (status != MPI_SUCCESS) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("MPI_Bcast of the unique id failed ({})", status));
    }
  };
  return std::make_unique<DeviceCommunicator>(api, size, rank, std::move(name), share_id, options);
}

DeviceCommunicator::~DeviceCommunicator() { destroy(); }

void DeviceCommunicator::destroy() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_ == nullptr || aborted_.load()) return;
  api_.comm_destroy(comm_);
  comm_ = nullptr;
}

std::string DeviceCommunicator::last_op() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_op_;
}

void DeviceCommunicator::abort() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_ != nullptr && !aborted_.exchange(true)) api_.comm_abort(comm_);
}

std::string DeviceCommunicator::describe() const {
  std::string who = options_.world_rank >= 0 ? fmt::format("rank {}: ", options_.world_rank) : "";
  return fmt::format("{}NCCL group {} (member {} of {})", who, name_, rank_, size_);
}

void DeviceCommunicator::abort_and_throw(const std::string& what) {
  std::string op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op = last_op_;
    if (comm_ != nullptr && !aborted_.exchange(true)) api_.comm_abort(comm_);
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("{}: {}: {} (communicator aborted)", describe(), op, what));
}

// Every enqueueing call: a synchronous failure is reported as an asynchronous one would be,
// with the group and op, and leaves the communicator aborted.
template <class Call>
void DeviceCommunicator::enqueue(const char* op, Call&& call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load() || (comm_ == nullptr && has_nccl())) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("{}: {}: the communicator was {}", describe(), op,
                              aborted_.load() ? "aborted after an earlier failure" : "destroyed"));
    }
    last_op_ = op;
  }
  try {
    std::forward<Call>(call)();
  } catch (const Error& error) {
    abort_and_throw(error.what());
  }
}

// A group of one's collective: `in` to `out` on the stream (nothing when they are one).
void DeviceCommunicator::copy_alone(const void* in, void* out, int64_t count, DeviceDtype dtype,
                                    StreamHandle stream) {
  if (in != out) api_.copy_device(out, in, count * device_dtype_bytes(dtype), stream);
}

void DeviceCommunicator::all_gather(const void* in, int64_t count, DeviceDtype dtype, void* out,
                                    StreamHandle stream) {
  enqueue("all_gather", [&] {
    if (!has_nccl()) return copy_alone(in, out, count, dtype, stream);
    api_.collective(comm_, CollectiveOp::kAllGather, in, out, count, dtype, stream);
  });
}

void DeviceCommunicator::reduce_scatter_sum(const void* in, int64_t count, DeviceDtype dtype,
                                            void* out, StreamHandle stream) {
  enqueue("reduce_scatter", [&] {
    if (!has_nccl()) return copy_alone(in, out, count, dtype, stream);
    api_.collective(comm_, CollectiveOp::kReduceScatterSum, in, out, count, dtype, stream);
  });
}

void DeviceCommunicator::all_reduce_sum(void* inout, int64_t count, DeviceDtype dtype,
                                        StreamHandle stream) {
  enqueue("all_reduce", [&] {
    if (!has_nccl()) return;  // the sum of one
    api_.collective(comm_, CollectiveOp::kAllReduceSum, inout, inout, count, dtype, stream);
  });
}

void DeviceCommunicator::send(const void* data, int64_t count, DeviceDtype dtype, int64_t peer,
                              StreamHandle stream) {
  DHELIX_CHECK(peer >= 0 && peer < size_);
  if (!has_nccl()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("{}: send: a group of one has no peer", describe()));
  }
  enqueue("send", [&] { api_.send(comm_, data, count, dtype, peer, stream); });
}

void DeviceCommunicator::recv(void* data, int64_t count, DeviceDtype dtype, int64_t peer,
                              StreamHandle stream) {
  DHELIX_CHECK(peer >= 0 && peer < size_);
  if (!has_nccl()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("{}: recv: a group of one has no peer", describe()));
  }
  enqueue("recv", [&] { api_.recv(comm_, data, count, dtype, peer, stream); });
}

template <class Calls>
void DeviceCommunicator::grouped(Calls&& calls) {
  api_.group_start();
  try {
    std::forward<Calls>(calls)();
  } catch (...) {
    try {
      api_.group_end();
    } catch (const Error&) {  // the first failure is the one to report
    }
    throw;
  }
  api_.group_end();
}

void DeviceCommunicator::ring_exchange(const void* send, void* recv, int64_t count,
                                       DeviceDtype dtype, StreamHandle stream) {
  DHELIX_CHECK(count >= 0 && send != recv);
  enqueue("ring_exchange", [&] {
    if (size_ == 1) {
      api_.copy_device(recv, send, count * device_dtype_bytes(dtype), stream);
      return;
    }
    const int64_t next = (rank_ + 1) % size_;
    const int64_t previous = (rank_ + size_ - 1) % size_;
    grouped([&] {
      api_.send(comm_, send, count, dtype, next, stream);
      api_.recv(comm_, recv, count, dtype, previous, stream);
    });
  });
}

void DeviceCommunicator::all_to_all_v(const void* in, const int64_t* send_counts, int64_t chunks,
                                      void* out, int64_t* recv_counts, int64_t block_capacity,
                                      DeviceDtype dtype, StreamHandle stream) {
  DHELIX_CHECK(chunks >= 1 && block_capacity >= 0 && in != out);
  const int64_t block_bytes = block_capacity * device_dtype_bytes(dtype);
  const int64_t count_bytes = chunks * device_dtype_bytes(DeviceDtype::kInt64);
  const auto block_in = [&](int64_t member) {
    return static_cast<const char*>(in) + member * block_bytes;
  };
  const auto block_out = [&](int64_t member) {
    return static_cast<char*>(out) + member * block_bytes;
  };
  enqueue("all_to_all_v", [&] {
    // This rank's own share: device copies on the stream, before the group.
    api_.copy_device(recv_counts + rank_ * chunks, send_counts + rank_ * chunks, count_bytes,
                     stream);
    api_.copy_device(block_out(rank_), block_in(rank_), block_bytes, stream);
    if (size_ == 1) return;
    grouped([&] {
      for (int64_t peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        api_.send(comm_, send_counts + peer * chunks, chunks, DeviceDtype::kInt64, peer, stream);
        api_.recv(comm_, recv_counts + peer * chunks, chunks, DeviceDtype::kInt64, peer, stream);
        api_.send(comm_, block_in(peer), block_capacity, dtype, peer, stream);
        api_.recv(comm_, block_out(peer), block_capacity, dtype, peer, stream);
      }
    });
  });
}

void DeviceCommunicator::poll() {
  if (aborted_.load() || comm_ == nullptr) return;
  const std::optional<std::string> error = api_.comm_async_error(comm_);
  if (error) abort_and_throw(*error);
}

void DeviceCommunicator::wait(StreamHandle stream) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (;;) {
    bool done = false;
    try {
      done = api_.stream_done(stream);
    } catch (const Error& error) {
      abort_and_throw(fmt::format("the stream failed: {}", error.what()));
    }
    if (done) return;
    poll();
    const double waited_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited_s > options_.timeout_s) {
      abort_and_throw(fmt::format("timed out after {:.0f} s", options_.timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace dhelix::cuda
