// The loopback communicators' CP ring step (runtime/comm/loopback_communicator.h): ranks as
// threads, each receiving its predecessor's block, exchanges matched in call order, and two
// groups' rings (two streams' communicators of one group of ranks) never mixing.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lib/error.h"
#include "runtime/comm/loopback_communicator.h"

namespace dhelix::rt {
namespace {

TEST(LoopbackRing, EachMemberReceivesItsPredecessorsBlocksInCallOrder) {
  constexpr int64_t kRanks = 3;
  LoopbackWorld world(kRanks);
  const std::vector<int64_t> members = {0, 1, 2};
  std::vector<std::vector<float>> received(kRanks);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      // Two communicators of the same members, as two streams hold: their rings interleave
      // in different orders on different ranks and must not mix.
      std::unique_ptr<Communicator> a = world.communicator("cp/a", members, rank, "cp");
      std::unique_ptr<Communicator> b = world.communicator("cp/b", members, rank, "cp");
      std::vector<float>& got = received[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < 4; ++step) {
        const float mine_a = 100.0f * rank + step, mine_b = -(100.0f * rank + step);
        float from_a = 0, from_b = 0;
        if (rank % 2 == 0) {
          a->ring_exchange(&mine_a, &from_a, 1);
          b->ring_exchange(&mine_b, &from_b, 1);
        } else {
          std::thread other([&] { b->ring_exchange(&mine_b, &from_b, 1); });
          a->ring_exchange(&mine_a, &from_a, 1);
          other.join();
        }
        got.push_back(from_a);
        got.push_back(from_b);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    const float previous = static_cast<float>((rank + kRanks - 1) % kRanks);
    std::vector<float> expected;
    for (int64_t step = 0; step < 4; ++step) {
      expected.push_back(100.0f * previous + step);
      expected.push_back(-(100.0f * previous + step));
    }
    EXPECT_EQ(received[static_cast<size_t>(rank)], expected) << "rank " << rank;
  }
}

TEST(LoopbackRing, AGroupOfOneGetsItsOwnBlockAndSizesMustAgree) {
  LoopbackWorld world(2);
  std::unique_ptr<Communicator> alone = world.communicator("one", {0}, 0, "cp");
  const std::vector<float> sent = {1, 2, 3};
  std::vector<float> got(3);
  alone->ring_exchange(sent.data(), got.data(), 3);
  EXPECT_EQ(got, sent);

  std::string error, other_error;
  std::thread other([&] {
    std::unique_ptr<Communicator> c = world.communicator("pair", {0, 1}, 1, "cp");
    float out[2] = {0, 0}, in[2];
    try {
      c->ring_exchange(out, in, 2);
    } catch (const Error& e) {
      other_error = e.what();
    }
  });
  std::unique_ptr<Communicator> c = world.communicator("pair", {0, 1}, 0, "cp");
  float out = 0, in = 0;
  try {
    c->ring_exchange(&out, &in, 1);
  } catch (const Error& e) {
    error = e.what();
  }
  other.join();
  EXPECT_EQ(error, "loopback: cp: ring_exchange of 1 elements met one of 2");
  EXPECT_EQ(other_error, "loopback: cp: ring_exchange of 2 elements met one of 1");
}

}  // namespace
}  // namespace dhelix::rt
