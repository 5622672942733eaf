#pragma once
// One NCCL process group as seen by one member, for the CUDA backend. Unlike the CPU
// backend's Communicator (runtime/comm/communicator.h), whose calls block until the data
// is there, every operation here is ENQUEUED on a device stream and returns at once: the
// collective runs when the stream reaches it, after the events the stream waits on
// (runtime/exec/stream_lowering.h). That is why this is a different interface,
// DeviceCommunicator, with a stream argument on every call. NCCL is reached through
// DeviceApi (device_api.h), so the recording fake of the tests stands in for it.
//
// Bootstrap: member 0 of the group asks for a unique id, `share_id` hands it to every
// member (an MPI_Bcast over the group's MPI communicator: create_over_mpi), and every
// member joins. As with MPI, each stream that runs collectives needs its own
// communicator: two NCCL collectives on one communicator must be enqueued in the same
// order on every member, which two independent streams cannot promise.
//
// Failures: a failing call throws at once. A failure inside an enqueued collective (a peer
// gone, a network error) shows only later, through the communicator's asynchronous error:
// poll() checks it and may be called from a watchdog thread while another thread enqueues;
// wait() polls while the host waits for a stream, up to the timeout. Either way the
// communicator is aborted (which also ends kernels stuck waiting for a peer) and
// Error(kInternal) is thrown naming the world rank, the group and the last operation
// enqueued: "rank 3: NCCL group tp (member 1 of 2): all_gather: ncclRemoteError: ...
// (communicator aborted)". An aborted communicator refuses every later call.
//
// A group of one (an expert-data-parallel group when ep = dp x cp, say) has no NCCL
// communicator and so none of NCCL's streams: its collectives are device copies on the
// stream (all_gather and reduce_scatter copy in to out, all_reduce does nothing, the ring
// step and the all-to-all copy this member's own share), and point-to-point calls are
// refused (a member has no peer).
//
// Destroying is collective over the members (NCCL's ncclCommDestroy documentation: it
// frees resources shared with the peers and may wait for them), so the owner destroys its
// communicators in one agreed order on every rank (device_comms.h); the destructor only
// destroys a communicator nobody has destroyed or aborted yet.
//
// Sums: NCCL reduces in the order of its ring or tree, not in member order, so results
// differ from the CPU backend's rank-order sums by rounding; they are reproducible run to
// run only with the algorithm and protocol pinned (NCCL_ALGO, NCCL_PROTO).

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

/// How long a host wait for the device (an iteration's end, a communicator's wait, the
/// warm-up) and the enqueueing of an iteration may take before dhelix declares the rank hung
/// and names what is busy: dhelix-run --watchdog-s's default, seconds. Five minutes: ten times
/// the longest iteration the planner's presets reach (tens of seconds) with iteration 1's
/// kernel loads and NCCL connections on top, so a slow step is never taken for a hang; and
/// half of ctest's 600 s and well under a batch scheduler's limits, so the report is written
/// before an outer timeout kills the job silently. Every GPU of the job idles while it
/// waits; a job that knows its iterations are short sets less (the tests set 60).
inline constexpr int64_t kDefaultWatchdogSeconds = 300;

struct DeviceCommOptions {
  /// How long wait() lets a stream run before it declares the group hung, seconds
  /// (dhelix-run --watchdog-s; its default, kDefaultWatchdogSeconds, is why).
  double timeout_s = kDefaultWatchdogSeconds;
  /// This process's world rank, for messages (-1: not given).
  int64_t world_rank = -1;
  /// Thread blocks each kernel of the communicator may occupy at most; 0: NCCL's default
  /// (DeviceApi::comm_init).
  int64_t max_ctas = 0;
};

class DeviceCommunicator {
 public:
  /// Joins group `name` as member `rank` of `size` (collective over the members):
  /// member 0 makes the id, share_id(id) gives every member member 0's id.
  DeviceCommunicator(DeviceApi& api, int64_t size, int64_t rank, std::string name,
                     const std::function<void(CommId&)>& share_id, DeviceCommOptions options = {});
  /// The bootstrap of the file comment over MPI communicator `group` (collective over it).
  static std::unique_ptr<DeviceCommunicator> create_over_mpi(DeviceApi& api, MPI_Comm group,
                                                             std::string name,
                                                             DeviceCommOptions options = {});
  /// Destroys the communicator unless destroy() or an abort already ended it.
  ~DeviceCommunicator();
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  int64_t size() const { return size_; }
  /// Whether NCCL backs it (false for a group of one: the file comment).
  bool has_nccl() const { return size_ > 1; }
  int64_t rank() const { return rank_; }
  const std::string& name() const { return name_; }

  /// out[size() * count] = every member's in[count], member order.
  void all_gather(const void* in, int64_t count, DeviceDtype dtype, void* out, StreamHandle stream);
  /// out[count] = sum over members of in[rank() * count, +count); in has size() * count.
  void reduce_scatter_sum(const void* in, int64_t count, DeviceDtype dtype, void* out,
                          StreamHandle stream);
  /// inout[count] = sum over members.
  void all_reduce_sum(void* inout, int64_t count, DeviceDtype dtype, StreamHandle stream);
  /// Point-to-point with group member `peer`. NCCL has no tags: a member's sends to one
  /// peer match that peer's receives in enqueue order.
  void send(const void* data, int64_t count, DeviceDtype dtype, int64_t peer, StreamHandle stream);
  void recv(void* data, int64_t count, DeviceDtype dtype, int64_t peer, StreamHandle stream);
  /// One step of the context-parallel ring, rt::Communicator::ring_exchange's contract:
  /// send[count] to member (rank + 1) mod size, recv[count] from member (rank - 1) mod size,
  /// as one NCCL group (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd), so that no
  /// member's send waits for its own receive: every member sends first and receives second
  /// and the ring would otherwise close into a cycle of waits. With two members, next and
  /// previous are the same peer. A group of one copies send to recv on the stream.
  void ring_exchange(const void* send, void* recv, int64_t count, DeviceDtype dtype,
                     StreamHandle stream);
  /// Expert parallelism's all-to-all on the device, padded to capacity. On the CPU the
  /// counts travel first and the blocks follow at offsets the counts give
  /// (rt::Communicator::all_to_all_v); here the counts exist only on the device (the router
  /// writes them), and enqueueing an NCCL call needs its size on the host, so every block
  /// has a fixed capacity instead and the counts say how much of it is valid:
  ///   in[size * block_capacity]: block j (from j * block_capacity) goes to member j;
  ///   out[size * block_capacity]: block j came from member j;
  ///   send_counts[size * chunks], recv_counts[size * chunks] (device int64): member j's
  ///     chunk counts for this rank arrive at recv_counts[j * chunks, +chunks).
  /// One NCCL group: per peer in member order, the counts' send and receive, then the
  /// block's; this rank's own counts and block are device copies before the group. No host
  /// wait; the cost is that full blocks travel (capacity padding, as Megatron-Core's
  /// "pad to capacity" dispatch does). in and out must not overlap.
  void all_to_all_v(const void* in, const int64_t* send_counts, int64_t chunks, void* out,
                    int64_t* recv_counts, int64_t block_capacity, DeviceDtype dtype,
                    StreamHandle stream);

  /// Checks for an asynchronous error; on one, aborts and throws (see the file comment).
  /// Thread-safe against the enqueueing thread.
  void poll();
  /// Blocks the host until `stream` has finished its work, polling; aborts and throws on an
  /// asynchronous error or after options.timeout_s. For set-up and between iterations only.
  void wait(StreamHandle stream);
  /// Aborts the communicator (local; ends NCCL calls and kernels waiting for a peer) without
  /// throwing: the enqueue watchdog's way to get a host stuck inside an NCCL call back
  /// (enqueue_watchdog.h). Thread-safe; nothing for an aborted or destroyed one.
  void abort() noexcept;
  /// Destroys the communicator now (collective: every member calls it at the same point
  /// of the agreed order). Nothing for an aborted or destroyed one.
  void destroy() noexcept;
  bool aborted() const { return aborted_.load(); }
  /// The last operation enqueued ("all_gather"; "init" before any), for hang reports.
  std::string last_op() const;

 private:
  template <class Call>
  void enqueue(const char* op, Call&& call);
  // Runs `calls` between group_start and group_end; group_end also runs when a call
  // throws, so that NCCL's group depth stays balanced for the abort that follows.
  template <class Calls>
  void grouped(Calls&& calls);
  [[noreturn]] void abort_and_throw(const std::string& what);
  void copy_alone(const void* in, void* out, int64_t count, DeviceDtype dtype, StreamHandle stream);
  std::string describe() const;

  DeviceApi& api_;
  CommHandle comm_ = nullptr;
  int64_t size_;
  int64_t rank_;
  std::string name_;
  DeviceCommOptions options_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // guards last_op_ and the abort
  std::string last_op_ = "init";
};

}  // namespace dhelix::cuda
