#pragma once
// One NCCL process group as seen by one member, for the CUDA backend. Unlike the CPU
// backend's Communicator (runtime/comm/communicator.h), whose calls block until the data
// is there, every operation here is ENQUEUED on a CUDA stream and returns at once: the
// collective runs when the stream reaches it, after the events the stream waits on
// (stream_lowering.h). That is why this is a different interface, DeviceCommunicator, with
// a stream argument on every call.
//
// Bootstrap: member 0 of the group calls ncclGetUniqueId, the id is broadcast over the
// group's MPI communicator (runtime/comm/process_groups.h makes one per group and stream),
// and every member calls ncclCommInitRank. As with MPI, each stream that runs collectives
// needs its own communicator: two NCCL collectives on one communicator must be enqueued in
// the same order on every member, which two independent streams cannot promise.
//
// Failures: a failing call throws at once (DHELIX_NCCL). A failure inside an enqueued
// collective (a peer gone, a network error) shows only later, through
// ncclCommGetAsyncError: poll() checks it and may be called from a watchdog thread while
// another thread enqueues; wait() polls while the host waits for a stream, up to the
// timeout. Either way the communicator is aborted (ncclCommAbort, which also ends kernels
// stuck waiting for a peer) and Error(kInternal) is thrown naming the world rank, the group
// and the last operation enqueued: "rank 3: NCCL group tp (member 1 of 2): all_gather:
// ncclRemoteError: ... (communicator aborted)". An aborted communicator refuses every
// later call.
//
// Sums: NCCL reduces in the order of its ring or tree, not in member order, so results
// differ from the CPU backend's rank-order sums by rounding; they are reproducible run to
// run only with the algorithm and protocol pinned (NCCL_ALGO, NCCL_PROTO).

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace dhelix::cuda {

/// Element type of a transfer.
enum class DeviceDtype { kFloat32, kBFloat16 };
const char* device_dtype_name(DeviceDtype dtype);  ///< "float32", "bfloat16"

struct DeviceCommOptions {
  /// How long wait() lets a stream run before it declares the group hung, seconds.
  double timeout_s = 600.0;
  /// This process's world rank, for messages (-1: not given).
  int64_t world_rank = -1;
};

class DeviceCommunicator {
 public:
  /// Joins the NCCL group `id` as member `rank` of `size` on the current CUDA device
  /// (collective over the members). `name` is the group's purpose ("tp", "dp", "pp").
  DeviceCommunicator(const ncclUniqueId& id, int64_t size, int64_t rank, std::string name,
                     DeviceCommOptions options = {});
  /// The bootstrap of the file comment over MPI communicator `group` (collective over it).
  static std::unique_ptr<DeviceCommunicator> create_over_mpi(MPI_Comm group, std::string name,
                                                             DeviceCommOptions options = {});
  /// Destroys the communicator (or nothing, once aborted).
  ~DeviceCommunicator();
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  int64_t size() const { return size_; }
  int64_t rank() const { return rank_; }
  const std::string& name() const { return name_; }

  /// out[size() * count] = every member's in[count], member order.
  void all_gather(const void* in, int64_t count, DeviceDtype dtype, void* out, cudaStream_t stream);
  /// out[count] = sum over members of in[rank() * count, +count); in has size() * count.
  void reduce_scatter_sum(const void* in, int64_t count, DeviceDtype dtype, void* out,
                          cudaStream_t stream);
  /// inout[count] = sum over members.
  void all_reduce_sum(void* inout, int64_t count, DeviceDtype dtype, cudaStream_t stream);
  /// Point-to-point with group member `peer`. NCCL has no tags: a member's sends to one
  /// peer match that peer's receives in enqueue order. A send and a receive that must
  /// progress together (pipeline exchanges) go between group_start() and group_end().
  void send(const void* data, int64_t count, DeviceDtype dtype, int64_t peer, cudaStream_t stream);
  void recv(void* data, int64_t count, DeviceDtype dtype, int64_t peer, cudaStream_t stream);
  /// ncclGroupStart / ncclGroupEnd around several operations.
  void group_start();
  void group_end();

  /// Checks for an asynchronous error; on one, aborts and throws (see the file comment).
  /// Thread-safe against the enqueueing thread.
  void poll();
  /// Blocks the host until `stream` has finished its work, polling; aborts and throws on an
  /// asynchronous error or after options.timeout_s. For the end of an iteration only.
  void wait(cudaStream_t stream);
  bool aborted() const { return aborted_.load(); }

 private:
  void begin(const char* op);
  [[noreturn]] void abort_and_throw(const std::string& what);
  std::string describe() const;

  ncclComm_t comm_ = nullptr;
  int64_t size_;
  int64_t rank_;
  std::string name_;
  DeviceCommOptions options_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // guards last_op_ and the abort
  std::string last_op_ = "init";
};

}  // namespace dhelix::cuda
