#include "runtime/cuda/pipeline_channels.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "lib/error.h"

namespace dhelix::cuda {

std::vector<ChannelMessages> channel_messages(const RankProgram& program) {
  std::map<int64_t, ChannelMessages> by_peer;
  for (const Instruction& instruction : program.instructions) {
    const bool send = instruction.kind == InstructionKind::kSend;
    if (!send && instruction.kind != InstructionKind::kRecv) continue;
    ChannelMessages& messages = by_peer[instruction.peer];
    messages.peer = instruction.peer;
    (send ? messages.sent_tags : messages.received_tags).push_back(instruction.tag);
  }
  std::vector<ChannelMessages> result;
  result.reserve(by_peer.size());
  for (auto& [peer, messages] : by_peer) result.push_back(std::move(messages));
  return result;
}

std::vector<int64_t> send_peers(const std::vector<ChannelMessages>& messages) {
  std::vector<int64_t> peers;
  for (const ChannelMessages& m : messages) {
    if (!m.sent_tags.empty()) peers.push_back(m.peer);
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

std::vector<ChannelPair> channel_pairs(
    const std::vector<std::vector<int64_t>>& send_peers_by_rank) {
  std::vector<ChannelPair> pairs;
  for (size_t rank = 0; rank < send_peers_by_rank.size(); ++rank) {
    for (int64_t peer : send_peers_by_rank[rank]) {
      pairs.push_back({.sender = static_cast<int64_t>(rank), .receiver = peer});
    }
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  return pairs;
}

std::optional<std::string> channel_content_mismatch(const ChannelPair& channel,
                                                    const std::vector<int64_t>& sent,
                                                    const std::vector<int64_t>& received,
                                                    int64_t num_layers) {
  std::map<int64_t, std::pair<int64_t, int64_t>> counts;  // tag -> (sent, received)
  for (int64_t tag : sent) ++counts[tag].first;
  for (int64_t tag : received) ++counts[tag].second;
  auto times = [](int64_t n) { return fmt::format("{} time{}", n, n == 1 ? "" : "s"); };
  for (const std::vector<int64_t>* list : {&sent, &received}) {
    for (int64_t tag : *list) {
      const auto [s, r] = counts[tag];
      if (s == r) continue;
      return fmt::format("pipeline channel {} -> {}: tag {} ({}) is sent {} but received {}",
                         channel.sender, channel.receiver, tag,
                         describe_transfer_tag(tag, num_layers), times(s), times(r));
    }
  }
  return std::nullopt;
}

std::optional<std::string> channel_order_mismatch(const ChannelPair& channel,
                                                  const std::vector<int64_t>& sent,
                                                  const std::vector<int64_t>& received,
                                                  int64_t num_layers) {
  const std::string name =
      fmt::format("pipeline channel {} -> {}", channel.sender, channel.receiver);
  auto message = [&](int64_t tag) {
    return fmt::format("tag {} ({})", tag, describe_transfer_tag(tag, num_layers));
  };
  const size_t common = std::min(sent.size(), received.size());
  for (size_t i = 0; i < common; ++i) {
    if (sent[i] == received[i]) continue;
    return fmt::format("{}: message {} is {} on the sender but {} on the receiver", name, i,
                       message(sent[i]), message(received[i]));
  }
  if (sent.size() == received.size()) return std::nullopt;
  const std::vector<int64_t>& longer = sent.size() > received.size() ? sent : received;
  auto count = [](size_t n) { return fmt::format("{} message{}", n, n == 1 ? "" : "s"); };
  return fmt::format("{}: the sender sends {} but the receiver receives {}; message {} is {}", name,
                     count(sent.size()), count(received.size()), common, message(longer[common]));
}

}  // namespace dhelix::cuda
