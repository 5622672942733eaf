#pragma once
// Pipeline channels: how the CUDA executor carries a rank program's sends and receives
// (lib/plan/rank_program.h) over NCCL. Pure host logic, tested on the CPU.
//
// NCCL has no tags: a member's sends to one peer match that peer's receives in enqueue
// order, per communicator. So every ORDERED pair of ranks that exchanges pipeline messages
// (sender -> receiver) gets a 2-member NCCL communicator of its own (sender = member 0,
// receiver = member 1), used by exactly one stream on each side: the sender's send stream
// (cross_comm, or compute in sequential mode) and the receiver's channel receive stream.
// The two ends of a channel do NOT list their messages in the same order in general: in
// co-executed programs a stage may send the gradient of micro-batch 0 before the
// activation of micro-batch 2 while its peer's program receives them the other way round
// (tiny-tp2-pp2 does; MPI's tags hide it on the CPU). The receiver therefore posts its
// receives in the SENDER's order: the setup (device_comms.h) exchanges both lists, refuses
// a run where they do not hold the same messages (channel_content_mismatch, naming the
// channel and the message), and keeps the sender's list as the receiver's posting order
// (device_schedule.h). Receives are posted up front with no waits, so posting them in
// another order than the program's costs nothing.
//
// Agreeing on the channels. Every rank must create the channel communicators in one order
// (each creation is collective over MPI_COMM_WORLD and then over the pair). Each rank
// lowers only its own program, so the ranks first all-gather the peers each one sends to;
// channel_pairs() then sorts the world's ordered pairs by (sender, receiver), which every
// rank computes alike from the same gathered data.

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lib/plan/rank_program.h"

namespace dhelix::cuda {

/// The pipeline messages one rank exchanges with one peer, in program order.
struct ChannelMessages {
  int64_t peer = -1;                   ///< world rank
  std::vector<int64_t> sent_tags;      ///< tags this rank sends to peer
  std::vector<int64_t> received_tags;  ///< tags this rank receives from peer
};

/// For each peer the program sends to or receives from, ascending by peer: the tags of its
/// sends and receives in program order.
std::vector<ChannelMessages> channel_messages(const RankProgram& program);

/// The peers `messages` sends at least one message to, ascending.
std::vector<int64_t> send_peers(const std::vector<ChannelMessages>& messages);

/// Per sender (world rank): the tags a rank receives from it, in the sender's send order.
using ReceiveOrders = std::map<int64_t, std::vector<int64_t>>;

/// One pipeline channel: messages flow from sender to receiver (world ranks).
struct ChannelPair {
  int64_t sender = -1;
  int64_t receiver = -1;
  auto operator<=>(const ChannelPair&) const = default;
};

/// Every channel of the world, sorted by (sender, receiver) without duplicates, from
/// send_peers_by_rank[r] = the peers rank r sends to. Every rank gets the same list from
/// the same input: the order in which all ranks create the channel communicators.
std::vector<ChannelPair> channel_pairs(const std::vector<std::vector<int64_t>>& send_peers_by_rank);

/// Compares a channel's sender list with its receiver list as multisets of tags. Empty when
/// they hold the same messages; otherwise names the first tag (in the sender's order, then
/// the receiver's) counted differently: "pipeline channel 2 -> 5: tag 14 (micro-batch 1,
/// activation into layer 0) is sent 1 time but received 0 times".
std::optional<std::string> channel_content_mismatch(const ChannelPair& channel,
                                                    const std::vector<int64_t>& sent,
                                                    const std::vector<int64_t>& received,
                                                    int64_t num_layers);

/// Compares a channel's sender list with its receiver list in order (what NCCL would need
/// if the receiver posted in its own program order). Empty when equal; otherwise,
/// e.g. "pipeline channel 2 -> 5: message 3 is tag 14 (micro-batch 1, activation into layer
/// 2) on the sender but tag 20 (micro-batch 1, activation into layer 5) on the receiver"
/// (messages counted from 0), or, when one list is a prefix of the other, "pipeline channel
/// 2 -> 5: the sender sends 8 messages but the receiver receives 7; message 7 is tag ...
/// (...)". num_layers decodes the tags.
std::optional<std::string> channel_order_mismatch(const ChannelPair& channel,
                                                  const std::vector<int64_t>& sent,
                                                  const std::vector<int64_t>& received,
                                                  int64_t num_layers);

}  // namespace dhelix::cuda
