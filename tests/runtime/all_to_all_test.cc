// Communicator::all_to_all_v over a LoopbackWorld (each rank a thread): the counts arrive
// before the data, blocks land in group-rank order, zero counts are allowed, and an output
// buffer too small is refused on the rank that would overflow. comm_test.cc runs the same
// exchange under mpirun.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lib/error.h"
#include "runtime/comm/loopback_communicator.h"
#include "tests/runtime/all_to_all_pattern.h"

namespace dhelix::rt {
namespace {

void on_every_rank(int64_t size, const std::function<void(Communicator&, int64_t)>& body) {
  LoopbackWorld world(size);
  std::vector<int64_t> members;
  for (int64_t r = 0; r < size; ++r) members.push_back(r);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = world.communicator("ep", members, r, "ep");
      body(*comm, r);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(LoopbackAllToAllV, BlocksArriveInGroupRankOrderWithTheirCounts) {
  for (int64_t n : {1, 2, 3, 4}) {
    for (int64_t chunks : {1, 2}) {
      std::vector<test::PatternSend> got(static_cast<size_t>(n));
      on_every_rank(n, [&](Communicator& comm, int64_t r) {
        const test::PatternSend send = test::pattern_send(r, n, chunks);
        test::PatternSend& mine = got[static_cast<size_t>(r)];
        mine.data.assign(static_cast<size_t>(2 * n * chunks), -1.0f);
        mine.counts.assign(static_cast<size_t>(n * chunks), -1);
        comm.all_to_all_v(send.data.data(), send.counts.data(), chunks, mine.data.data(),
                          mine.counts.data(), static_cast<int64_t>(mine.data.size()));
      });
      for (int64_t r = 0; r < n; ++r) {
        SCOPED_TRACE("n " + std::to_string(n) + " chunks " + std::to_string(chunks) + " rank " +
                     std::to_string(r));
        const test::PatternSend want = test::pattern_expected(r, n, chunks);
        const test::PatternSend& have = got[static_cast<size_t>(r)];
        EXPECT_EQ(have.counts, want.counts);
        EXPECT_EQ(std::vector<float>(have.data.begin(), have.data.begin() + want.data.size()),
                  want.data);
        // Nothing written past the received elements.
        for (size_t i = want.data.size(); i < have.data.size(); ++i) EXPECT_EQ(have.data[i], -1.0f);
      }
    }
  }
}

TEST(LoopbackAllToAllV, AnOutputTooSmallIsAnInternalError) {
  std::vector<std::string> errors(2);
  on_every_rank(2, [&](Communicator& comm, int64_t r) {
    const std::vector<int64_t> counts = {3, 3};
    const std::vector<float> in(6, 1.0f);
    std::vector<float> out(4);
    std::vector<int64_t> received(2);
    try {
      comm.all_to_all_v(in.data(), counts.data(), 1, out.data(), received.data(), 4);
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInternal);
      errors[static_cast<size_t>(r)] = error.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_EQ(error, "ep: all_to_all_v receives 6 elements into a buffer of 4");
  }
}

}  // namespace
}  // namespace dhelix::rt
