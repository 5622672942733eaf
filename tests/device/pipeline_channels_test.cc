#include "runtime/cuda/pipeline_channels.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix::cuda {
namespace {

struct Loaded {
  Plan plan;
  JobSpec job;
};

Loaded load(const std::string& name) {
  Loaded loaded{read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json"),
                {}};
  loaded.job = job_from_plan(loaded.plan, name);
  return loaded;
}

int64_t world_size(const JobSpec& job) {
  return job.parallel.dp * job.parallel.tp * job.parallel.pp * job.parallel.cp;
}

std::vector<std::vector<ChannelMessages>> messages_of_world(const Loaded& l, ExecutionMode mode) {
  std::vector<std::vector<ChannelMessages>> world;
  for (int64_t rank = 0; rank < world_size(l.job); ++rank) {
    world.push_back(channel_messages(lower_rank_program(l.plan, l.job, rank, mode)));
  }
  return world;
}

const ChannelMessages& with_peer(const std::vector<ChannelMessages>& messages, int64_t peer) {
  for (const ChannelMessages& m : messages) {
    if (m.peer == peer) return m;
  }
  throw std::runtime_error("no channel with peer " + std::to_string(peer));
}

TEST(PipelineChannels, ChannelPairsAreSortedAndUnique) {
  const std::vector<ChannelPair> pairs = channel_pairs({{2, 1}, {0}, {0, 1}, {}});
  const std::vector<ChannelPair> expected = {{0, 1}, {0, 2}, {1, 0}, {2, 0}, {2, 1}};
  EXPECT_EQ(pairs, expected);
  EXPECT_EQ(send_peers({{.peer = 3, .sent_tags = {1}, .received_tags = {}},
                        {.peer = 1, .sent_tags = {}, .received_tags = {2}},
                        {.peer = 0, .sent_tags = {4}, .received_tags = {}}}),
            (std::vector<int64_t>{0, 3}));
}

// tiny-tp2-pp2: stage 0 = ranks {0, 1} (layers 0 and 3), stage 1 = ranks {2, 3} (layers 1
// and 2); every TP rank talks to the TP rank of the same index in the other stage, in both
// directions. Both ends always hold the same messages; in sequential programs also in the
// same order, in co-executed ones not (hence posting in the sender's order).
TEST(PipelineChannels, TinyTp2Pp2ListsHoldTheSameMessages) {
  const Loaded l = load("tiny-tp2-pp2");
  const int64_t layers = l.job.model.num_layers;
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const auto world = messages_of_world(l, mode);
    std::vector<std::vector<int64_t>> peers;
    for (const auto& messages : world) peers.push_back(send_peers(messages));
    const std::vector<ChannelPair> pairs = channel_pairs(peers);
    const std::vector<ChannelPair> expected = {{0, 2}, {1, 3}, {2, 0}, {3, 1}};
    ASSERT_EQ(pairs, expected) << execution_mode_name(mode);
    for (const ChannelPair& pair : pairs) {
      const auto& sent = with_peer(world[pair.sender], pair.receiver).sent_tags;
      const auto& received = with_peer(world[pair.receiver], pair.sender).received_tags;
      EXPECT_EQ(sent.size(), 8u);  // 4 micro-batches x 2 boundaries in each direction
      EXPECT_EQ(channel_content_mismatch(pair, sent, received, layers), std::nullopt);
      if (mode == ExecutionMode::kSequential) {
        EXPECT_EQ(channel_order_mismatch(pair, sent, received, layers), std::nullopt);
      }
    }
  }
  // A receiver that takes two messages in the other order is named, message by message.
  const auto world = messages_of_world(l, ExecutionMode::kCoExecuted);
  const std::vector<int64_t>& sent = with_peer(world[0], 2).sent_tags;
  ASSERT_EQ((std::vector<int64_t>(sent.begin(), sent.begin() + 4)),
            (std::vector<int64_t>{4, 16, 7, 28}));
  std::vector<int64_t> received = with_peer(world[2], 0).received_tags;
  EXPECT_EQ(channel_order_mismatch({0, 2}, sent, received, layers), std::nullopt);
  std::swap(received[2], received[3]);
  EXPECT_EQ(channel_order_mismatch({0, 2}, sent, received, layers),
            "pipeline channel 0 -> 2: message 2 is tag 7 (micro-batch 0, gradient of layer 2's "
            "output) on the sender but tag 28 (micro-batch 2, activation into layer 1) on the "
            "receiver");
}

TEST(PipelineChannels, PermutedSequentialListIsReported) {
  const Loaded l = load("tiny-tp2-pp2");
  const auto world = messages_of_world(l, ExecutionMode::kSequential);
  const std::vector<int64_t> sent = with_peer(world[0], 2).sent_tags;
  std::vector<int64_t> received = with_peer(world[2], 0).received_tags;
  ASSERT_EQ(sent, received);
  // L = 4: mb 0..3 into layer 1 are tags 4, 16, 28, 40; mb 0, 1 gradients of layer 2's
  // output 7, 19; then mb 2, 3's gradients 31, 43.
  ASSERT_EQ(sent, (std::vector<int64_t>{4, 16, 28, 7, 40, 19, 31, 43}));
  std::swap(received[2], received[3]);
  EXPECT_EQ(channel_order_mismatch({0, 2}, sent, received, 4),
            "pipeline channel 0 -> 2: message 2 is tag 28 (micro-batch 2, activation into layer "
            "1) on the sender but tag 7 (micro-batch 0, gradient of layer 2's output) on the "
            "receiver");
  EXPECT_EQ(channel_content_mismatch({0, 2}, sent, received, 4), std::nullopt);
  received[5] = 1000;  // mb 83 into layer 1: (83 * 6 + 2) * 2
  EXPECT_EQ(channel_content_mismatch({0, 2}, sent, received, 4),
            "pipeline channel 0 -> 2: tag 19 (micro-batch 1, gradient of layer 2's output) is "
            "sent 1 time but received 0 times");
}

TEST(PipelineChannels, ContentMismatchNamesTheFirstMiscountedTag) {
  // L = 4: tag 2 = mb 0 into layer 0; tag 14 = mb 1 into layer 0; tag 9 = mb 0, gradient
  // of layer 3's output.
  EXPECT_EQ(channel_content_mismatch({2, 5}, {2, 14, 9}, {9, 2, 14}, 4), std::nullopt);
  EXPECT_EQ(channel_content_mismatch({2, 5}, {2, 14}, {2, 14, 9}, 4),
            "pipeline channel 2 -> 5: tag 9 (micro-batch 0, gradient of layer 3's output) is "
            "sent 0 times but received 1 time");
  EXPECT_EQ(channel_content_mismatch({2, 5}, {2, 14, 14}, {14, 2}, 4),
            "pipeline channel 2 -> 5: tag 14 (micro-batch 1, activation into layer 0) is sent "
            "2 times but received 1 time");
}

TEST(PipelineChannels, HandPermutedListGivesExactMessage) {
  // L = 4: tag 2 = mb 0 into layer 0; tag 14 = mb 1 into layer 0; tag 9 = mb 0, gradient
  // of layer 3's output.
  const std::vector<int64_t> sent = {2, 14, 9};
  const std::vector<int64_t> received = {2, 9, 14};
  EXPECT_EQ(channel_order_mismatch({2, 5}, sent, received, 4),
            "pipeline channel 2 -> 5: message 1 is tag 14 (micro-batch 1, activation into "
            "layer 0) on the sender but tag 9 (micro-batch 0, gradient of layer 3's output) on "
            "the receiver");
  EXPECT_EQ(channel_order_mismatch({2, 5}, sent, {2, 14}, 4),
            "pipeline channel 2 -> 5: the sender sends 3 messages but the receiver receives 2 "
            "messages; "
            "message 2 is tag 9 (micro-batch 0, gradient of layer 3's output)");
  EXPECT_EQ(channel_order_mismatch({2, 5}, {2}, sent, 4),
            "pipeline channel 2 -> 5: the sender sends 1 message but the receiver receives 3 "
            "messages; "
            "message 1 is tag 14 (micro-batch 1, activation into layer 0)");
}

}  // namespace
}  // namespace dhelix::cuda
