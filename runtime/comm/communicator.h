#pragma once
// One process group as seen by one of its members: the collectives the runtime needs, and
// point-to-point transfers between ranks of the world. The runtime calls them from its
// communication streams (runtime/exec/), one thread per stream, so several communicators
// of one rank are in use at the same time; one communicator is only ever used by one
// thread at a time.
//
// Determinism: every sum adds the members' contributions in group-rank order 0, 1, ..., n-1
// (never in the order messages arrive, never by a library's tree or ring whose shape may
// change with the message size), so a sum is the same bits on every member and in every
// run. That is what makes `dhelix-run --verify` able to demand bitwise equality, and what
// keeps data-parallel replicas' weights identical without broadcasting them.
//
// Layout: all_gather concatenates the members' blocks in group-rank order; reduce_scatter
// splits its input into n equal blocks and member r receives the sum of block r.

#include <cstdint>
#include <memory>
#include <string>

namespace dhelix::rt {

/// A point-to-point transfer in flight; wait() returns once the buffer may be reused
/// (send) or holds the message (receive). Destroying an unfinished request waits for it.
class TransferRequest {
 public:
  virtual ~TransferRequest() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// Members in the group (>= 1).
  virtual int64_t size() const = 0;
  /// This process's index in the group, 0 <= rank() < size().
  virtual int64_t rank() const = 0;
  /// What the group is for ("tp", "cp", "dp", "pp", "world", ...), for messages.
  virtual const std::string& name() const = 0;

  /// out[size() * count] = every member's in[count], in group-rank order.
  virtual void all_gather(const float* in, int64_t count, float* out) = 0;
  /// out[count] = sum over members r (in order r = 0..n-1) of in_r[rank() * count, +count);
  /// in holds size() * count elements.
  virtual void reduce_scatter_sum(const float* in, int64_t count, float* out) = 0;
  /// inout[count] = sum over members (in group-rank order) of their inout; count need not
  /// be a multiple of size().
  virtual void all_reduce_sum(float* inout, int64_t count) = 0;
  /// Waits until every member has called barrier().
  virtual void barrier() = 0;
  /// One step of the context-parallel ring (runtime/model/layer_ops_cp.h): sends
  /// send[count] to the next member, group rank (rank() + 1) mod size(), and receives
  /// count elements from the previous one into recv (not overlapping send). Every member
  /// calls it with the same count; successive calls on one communicator match in call
  /// order, apart from the point-to-point transfers below. A group of one copies send
  /// to recv.
  virtual void ring_exchange(const float* send, float* recv, int64_t count) = 0;
  /// All-to-all with per-member counts (expert parallelism's dispatch and combine): member
  /// r's `in` holds one block per member j, in group-rank order, each block `chunks`
  /// contiguous chunks of send_counts[j * chunks + c] elements. The counts go first (an
  /// all-to-all of `chunks` int64 per member), so recv_counts[j * chunks + c] returns member
  /// j's counts for this rank; then out receives the members' blocks for this rank in
  /// group-rank order, contiguous. `out_capacity` is out's size; a total above it is
  /// Error(kInternal) (before any data moves). in and out must not overlap. No arithmetic:
  /// the elements arrive as sent.
  virtual void all_to_all_v(const float* in, const int64_t* send_counts, int64_t chunks, float* out,
                            int64_t* recv_counts, int64_t out_capacity) = 0;
  /// The largest of the members' `value`s, the same on every member: how ranks agree on
  /// whether any of them failed, diverged or was signalled (runtime/train/rank_agreement.h).
  virtual int64_t all_reduce_max(int64_t value) = 0;

  // Point-to-point (MpiCommunicator): any group's communicator accepts a member's world
  // rank as peer; a send matches only a receive posted on the same group and CommSlot at
  // the peer (process_groups.h), with the same tag.

  /// Starts sending data[count] to world rank `peer` with `tag` (>= 0). The buffer must
  /// stay unchanged until the request's wait() returns.
  virtual std::unique_ptr<TransferRequest> start_send(const float* data, int64_t count,
                                                      int64_t peer, int64_t tag) = 0;
  /// Starts receiving count elements from world rank `peer` with `tag` into data.
  virtual std::unique_ptr<TransferRequest> start_recv(float* data, int64_t count, int64_t peer,
                                                      int64_t tag) = 0;
};

}  // namespace dhelix::rt
