#pragma once
// Communicator over one MPI communicator, with deterministic sums (communicator.h).
//
// MPI's own reductions (MPI_Reduce_scatter, MPI_Allreduce with MPI_SUM) leave the order of
// additions to the library, which picks trees and rings by message size and process
// count, so they are not used. reduce_scatter_sum moves the blocks with MPI_Alltoall and
// adds them here, in group-rank order; all_reduce_sum is that reduce-scatter over padded
// blocks followed by an all-gather. Data moved twice instead of once in the tree, in
// exchange for a sum that is the same bits on every member and in every run.
//
// Point-to-point: peers are world ranks (as the plan names them); the communicator turns
// them into its own ranks, so any group's communicator can carry a transfer between two of
// its members. A send matches only a receive posted on the same communicator at the peer,
// i.e. the same group and the same slot (process_groups.h).

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace dhelix::rt {

class MpiCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm` (freed by the destructor unless it is MPI_COMM_WORLD or
  /// MPI_COMM_SELF) and sets MPI_ERRORS_RETURN on it. `name` is what the group is for
  /// ("tp", "world"); it starts every error message.
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  const std::string& name() const override { return name_; }

  /// Throws Error(kUnsupported) when count exceeds INT_MAX (MPI's count type).
  void all_gather(const float* in, int64_t count, float* out) override;
  /// Throws Error(kUnsupported) when count exceeds INT_MAX. out may alias in.
  void reduce_scatter_sum(const float* in, int64_t count, float* out) override;
  /// Pads count up to a multiple of size(); throws Error(kUnsupported) when a padded block
  /// exceeds INT_MAX elements.
  void all_reduce_sum(float* inout, int64_t count) override;
  void barrier() override;
  /// Throws Error(kUnsupported) when a block or an offset exceeds INT_MAX elements.
  void all_to_all_v(const float* in, const int64_t* send_counts, int64_t chunks, float* out,
                    int64_t* recv_counts, int64_t out_capacity) override;
  int64_t all_reduce_max(int64_t value) override;
  /// MPI_Isend to the next member and MPI_Irecv from the previous one on this
  /// communicator with tag kRingTag, waited as mpi_wait.h's mode says.
  void ring_exchange(const float* send, float* recv, int64_t count) override;

  /// Throws Error(kInternal) when `peer` is not a member of this group or
  /// when `tag` is outside [0, MPI_TAG_UB] (both bugs of the caller), and Error(kUnsupported)
  /// when count exceeds INT_MAX.
  std::unique_ptr<TransferRequest> start_send(const float* data, int64_t count, int64_t peer,
                                              int64_t tag) override;
  /// Same checks as start_send.
  std::unique_ptr<TransferRequest> start_recv(float* data, int64_t count, int64_t peer,
                                              int64_t tag) override;

  /// World rank of each member, indexed by group rank (ascending for groups split with the
  /// world rank as key).
  const std::vector<int64_t>& world_ranks() const { return world_ranks_; }
  /// Largest tag this MPI accepts (MPI_TAG_UB; at least 32767 by the standard).
  int64_t tag_upper_bound() const { return tag_upper_bound_; }
  /// The underlying MPI communicator, still owned by this object.
  MPI_Comm handle() const { return comm_; }
  /// The tag of ring_exchange's messages. Point-to-point transfers on the same
  /// communicator use other tags or other communicators (process_groups.h).
  static constexpr int kRingTag = 0;

 private:
  int count_as_int(int64_t count, const char* operation) const;
  int group_rank_of_world_rank(int64_t peer) const;
  int checked_tag(int64_t tag) const;

  MPI_Comm comm_;
  std::string name_;
  int64_t size_ = 1;
  int64_t rank_ = 0;
  int64_t tag_upper_bound_ = 32767;
  std::vector<int64_t> world_ranks_;
  // Scratch for the sums, kept between calls: one thread uses a communicator at a time.
  std::vector<float> received_;
  std::vector<float> padded_;
};

}  // namespace dhelix::rt
