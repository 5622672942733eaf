// runtime/train/rank_agreement.h over a LoopbackWorld: each rank a thread, as the trainer's
// ranks are processes under mpirun.

#include "runtime/train/rank_agreement.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/loopback_communicator.h"
#include "runtime/train/setup_failure.h"

namespace dhelix::rt {
namespace {

// Runs body(world communicator, rank) on `size` threads; returns each rank's result.
template <class Result>
std::vector<Result> on_every_rank(int64_t size,
                                  const std::function<Result(Communicator&, int64_t)>& body) {
  LoopbackWorld world(size);
  std::vector<int64_t> members;
  for (int64_t r = 0; r < size; ++r) members.push_back(r);
  std::vector<Result> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = world.communicator("world", members, r, "world");
      results[static_cast<size_t>(r)] = body(*comm, r);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(RankAgreement, AllReduceMaxIsTheLargestOnEveryRank) {
  const std::vector<int64_t> got = on_every_rank<int64_t>(
      3, [](Communicator& world, int64_t rank) { return world.all_reduce_max(10 - 4 * rank); });
  EXPECT_EQ(got, (std::vector<int64_t>{10, 10, 10}));
  // Twice in a row: the staging area is reused only after every member has read it.
  const std::vector<int64_t> twice = on_every_rank<int64_t>(3, [](Communicator& w, int64_t r) {
    const int64_t first = w.all_reduce_max(r);
    return first * 100 + w.all_reduce_max(-r);
  });
  EXPECT_EQ(twice, (std::vector<int64_t>{200, 200, 200}));
}

TEST(RankAgreement, AnyRankSeesOneRanksFlag) {
  EXPECT_EQ(on_every_rank<int>(4, [](Communicator& w, int64_t r) { return any_rank(w, r == 2); }),
            (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(on_every_rank<int>(4, [](Communicator& w, int64_t) { return any_rank(w, false); }),
            (std::vector<int>{0, 0, 0, 0}));
}

// What agree_on_setup did on one rank: "" when it returned, else the code and message.
std::string setup_outcome(Communicator& world, bool fail, const std::string& reason) {
  std::exception_ptr failure;
  if (fail) failure = std::make_exception_ptr(Error(ErrorCode::kIo, reason));
  try {
    agree_on_setup(world, failure);
  } catch (const SetupFailure& error) {
    return std::to_string(static_cast<int>(error.code())) + " " + error.what();
  }
  return "";
}

TEST(RankAgreement, SetupStopsEveryRankWhenOneFailed) {
  const std::vector<std::string> got =
      on_every_rank<std::string>(3, [](Communicator& w, int64_t r) {
        return setup_outcome(w, r == 1, "plan.json: cannot be read");
      });
  const std::string io = std::to_string(static_cast<int>(ErrorCode::kIo));
  EXPECT_EQ(got[0], io + " stopped: rank 1 failed");
  EXPECT_EQ(got[1], io + " plan.json: cannot be read");
  EXPECT_EQ(got[2], io + " stopped: rank 1 failed");
}

// Two ranks fail: the lower one reports (once), everyone exits with its status.
TEST(RankAgreement, TheFirstFailingRankReports) {
  const std::vector<std::string> got =
      on_every_rank<std::string>(4, [](Communicator& w, int64_t r) {
        std::exception_ptr failure;
        if (r == 3) failure = std::make_exception_ptr(Error(ErrorCode::kIo, "three"));
        if (r == 2) failure = std::make_exception_ptr(Error(ErrorCode::kInvalidInput, "two"));
        try {
          agree_on_setup(w, failure);
        } catch (const SetupFailure& error) {
          return std::to_string(static_cast<int>(error.code())) + " " + error.what() +
                 (error.reported_elsewhere() ? " (silent)" : "");
        }
        return std::string();
      });
  const std::string invalid = std::to_string(static_cast<int>(ErrorCode::kInvalidInput));
  EXPECT_EQ(got[0], invalid + " stopped: rank 2 failed (silent)");
  EXPECT_EQ(got[2], invalid + " two");
  EXPECT_EQ(got[3], invalid + " stopped: rank 2 failed (silent)");
}

TEST(RankAgreement, SetupPassesWhenNoRankFailed) {
  const std::vector<std::string> got = on_every_rank<std::string>(
      2, [](Communicator& w, int64_t) { return setup_outcome(w, false, ""); });
  EXPECT_EQ(got, (std::vector<std::string>{"", ""}));
}

}  // namespace
}  // namespace dhelix::rt
