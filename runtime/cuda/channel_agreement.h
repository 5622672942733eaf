#pragma once
// How the ranks agree on their pipeline channels (runtime/cuda/pipeline_channels.h) before
// any NCCL communicator exists: step 1 of the device setup (runtime/cuda/device_comms.h).
// MPI only, no CUDA, so that the agreement is tested on the CPU under mpirun
// (tests/runtime/channel_agreement_test.cc).
//
// Every step is collective over MPI_COMM_WORLD and runs in one order on every rank:
//   1. the ranks all-gather the (sender, receiver) pairs their programs use, as sender or
//      as receiver (so a receive that no program of the peer sends still gets a channel);
//      channel_pairs() sorts them: the world's channel order;
//   2. one MPI_Comm_split of MPI_COMM_WORLD per channel, in that order (non-members pass
//      MPI_UNDEFINED); the sender gets key 0, so it is member 0 of the pair;
//   3. for each program, in the order given: both ends of each channel exchange their tag
//      lists over the pair's communicator, in channel order (a total order over pairs, so
//      the earliest pending exchange always has both ends waiting on it), and compare them
//      (channel_content_mismatch); an MPI_Allreduce then makes EVERY rank throw
//      rt::SetupFailure (kInvalidInput) when any channel differs. The receiver keeps the
//      sender's list as the order in which it posts that channel's receives.

#include <mpi.h>

#include <cstdint>
#include <map>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/cuda/pipeline_channels.h"

namespace dhelix::cuda {

class ChannelAgreement {
 public:
  /// The steps of the file comment. `programs`: every program this rank will execute (e.g.
  /// the co-executed and the sequential one), at most one per mode. `num_layers` decodes
  /// tags in messages: "rank 2, co-executed program: pipeline channel 0 -> 2: tag 43
  /// (micro-batch 3, gradient of layer 2's output) is sent 1 time but received 0 times; a
  /// message sent and never received (or the reverse) would hang NCCL"; ranks whose own
  /// channels agree say "the pipeline channels of another rank disagree (its error names
  /// the channel)" instead.
  ChannelAgreement(const std::vector<const RankProgram*>& programs, int64_t world_rank,
                   int64_t num_layers);
  /// Frees the pair communicators still held.
  ~ChannelAgreement();
  ChannelAgreement(const ChannelAgreement&) = delete;
  ChannelAgreement& operator=(const ChannelAgreement&) = delete;

  /// The world's channels in creation order.
  const std::vector<ChannelPair>& channels() const { return channels_; }
  /// The MPI communicator of channels()[i] (member 0 = sender); MPI_COMM_NULL when this
  /// rank is not one of its ends or after release_communicators().
  MPI_Comm communicator(size_t i) const { return comms_[i]; }
  /// Frees every pair communicator (once NCCL is initialised over them).
  void release_communicators() noexcept;
  /// Per mode given: per sender, the tags this rank receives from it in the sender's order.
  const std::map<ExecutionMode, ReceiveOrders>& receive_orders() const { return orders_; }

 private:
  void split();
  void check(const RankProgram& program, int64_t num_layers);

  int64_t world_rank_;
  std::vector<ChannelPair> channels_;
  std::vector<MPI_Comm> comms_;
  std::map<ExecutionMode, ReceiveOrders> orders_;
};

}  // namespace dhelix::cuda
