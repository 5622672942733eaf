// The MPI communication layer under mpirun (4 ranks and 2 ranks): layouts of the
// collectives, sums added in group-rank order (the same bits everywhere), groups split as
// the placement says, two threads on two slots at once, tagged point-to-point transfers,
// and the error messages.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/error.h"
#include "lib/parallel_spec.h"
#include "lib/placement.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/comm/mpi_wait.h"
#include "runtime/comm/process_groups.h"
#include "tests/runtime/all_to_all_pattern.h"
#include "tests/runtime/mpi_world.h"

namespace dhelix::rt {
namespace {

using test::world_rank;
using test::world_size;

Placement placement_of(int64_t tp, int64_t dp, int64_t pp) {
  ParallelSpec parallel;
  parallel.tp = tp;
  parallel.dp = dp;
  parallel.pp = pp;
  return Placement(parallel, /*gpus_per_node=*/4);
}

// A value per rank whose float sum depends on the order of addition: in rank order
// ((1e8 + 1) - 1e8) + 1 = 1 (1e8 + 1 rounds back to 1e8), while pairing as a tree does,
// (1e8 + 1) + (-1e8 + 1), gives 0, and 1e8 - 1e8 + 1 + 1 gives 2.
float order_sensitive_value(int64_t rank) {
  const float values[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  return values[rank % 4];
}

// The rank-order sum of order_sensitive_value over 2 or 4 ranks, by hand.
float order_sensitive_sum(int64_t size) { return size == 4 ? 1.0f : 1e8f; }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

TEST(CommCollectives, AllGatherConcatenatesBlocksInGroupRankOrder) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  ASSERT_EQ(n, world_size());
  ASSERT_EQ(r, world_rank());
  EXPECT_EQ(world.name(), "world");

  const std::vector<float> in = {100.0f * r, 100.0f * r + 1, 100.0f * r + 2};
  std::vector<float> out(3 * n, -1.0f);
  world.all_gather(in.data(), 3, out.data());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out[3 * j + i], 100.0f * j + i) << j << "," << i;
  }

  // In place: the own block already sits in the output.
  std::vector<float> in_place(2 * n, -1.0f);
  in_place[2 * r] = 7.0f * r;
  in_place[2 * r + 1] = 7.0f * r + 1;
  world.all_gather(in_place.data() + 2 * r, 2, in_place.data());
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(in_place[2 * j], 7.0f * j);
    EXPECT_EQ(in_place[2 * j + 1], 7.0f * j + 1);
  }
}

TEST(CommCollectives, ReduceScatterAddsInGroupRankOrderWithTheSameBitsEverywhere) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  // Block j of member r: {order-sensitive value, 100 j + 10 + r, 100 j + 20 + r}.
  std::vector<float> in(3 * n);
  for (int64_t j = 0; j < n; ++j) {
    in[3 * j] = order_sensitive_value(r);
    in[3 * j + 1] = 100.0f * j + 10 + r;
    in[3 * j + 2] = 100.0f * j + 20 + r;
  }
  std::vector<float> out(3, -1.0f);
  world.reduce_scatter_sum(in.data(), 3, out.data());
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);
  EXPECT_TRUE(same_bits(out[0], order_sensitive_sum(n))) << out[0];
  EXPECT_EQ(out[1], n * (100.0f * r + 10) + rank_sum);
  EXPECT_EQ(out[2], n * (100.0f * r + 20) + rank_sum);

  // Every member got the same bits for the order-sensitive element.
  std::vector<float> firsts(n);
  world.all_gather(out.data(), 1, firsts.data());
  for (float first : firsts) EXPECT_TRUE(same_bits(first, firsts[0]));

  // out may alias in: the output is written once every block has arrived.
  world.reduce_scatter_sum(in.data(), 3, in.data());
  EXPECT_TRUE(same_bits(in[0], order_sensitive_sum(n)));
  EXPECT_EQ(in[1], n * (100.0f * r + 10) + rank_sum);
}

// --comm-wait: MPI's blocking calls (spin) and the non-blocking calls waited for with
// test-and-back-off move the same data and sum in the same order: the same bits, and a
// transfer waited for out of order still completes.
TEST(CommWaitModes, SpinAndBackoffGiveTheSameBits) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  std::vector<std::vector<float>> results;
  EXPECT_EQ(mpi_max_sleep_us(), kDefaultMaxSleepUs);
  set_mpi_max_sleep_us(3);  // --comm-max-sleep-us: how often backoff tests, never what moves
  EXPECT_EQ(mpi_max_sleep_us(), 3);
  for (MpiWaitMode mode : {MpiWaitMode::kSpin, MpiWaitMode::kBackoff}) {
    set_mpi_wait_mode(mode);
    EXPECT_EQ(mpi_wait_mode(), mode);
    std::vector<float> values(1000);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = order_sensitive_value(r) * static_cast<float>(i + 1);
    }
    world.all_reduce_sum(values.data(), static_cast<int64_t>(values.size()));
    world.barrier();
    // A pipeline-style exchange with the neighbours, received before it is sent.
    std::vector<float> got(4, -1.0f), sent(4, static_cast<float>(r));
    const int64_t next = (r + 1) % n, previous = (r + n - 1) % n;
    auto receive = world.start_recv(got.data(), 4, previous, 7);
    auto send = world.start_send(sent.data(), 4, next, 7);
    receive->wait();
    send->wait();
    EXPECT_EQ(got[3], static_cast<float>(previous));
    results.push_back(values);
  }
  set_mpi_wait_mode(MpiWaitMode::kBackoff);  // the defaults, for the tests that follow
  set_mpi_max_sleep_us(kDefaultMaxSleepUs);
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_TRUE(same_bits(results[0][i], results[1][i])) << "element " << i;
  }
  EXPECT_EQ(parse_mpi_wait_mode("spin"), MpiWaitMode::kSpin);
  EXPECT_EQ(parse_mpi_wait_mode("busy"), std::nullopt);
}

TEST(CommCollectives, AllToAllVMovesBlocksOfVaryingCountsInBothWaitModes) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kLocalComm);
  const int64_t n = world.size(), r = world.rank();
  for (MpiWaitMode mode : {MpiWaitMode::kSpin, MpiWaitMode::kBackoff}) {
    set_mpi_wait_mode(mode);
    for (int64_t chunks : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << mpi_wait_mode_name(mode) << " chunks " << chunks);
      const test::PatternSend send = test::pattern_send(r, n, chunks);
      const test::PatternSend want = test::pattern_expected(r, n, chunks);
      std::vector<float> out(static_cast<size_t>(2 * n * chunks), -1.0f);
      std::vector<int64_t> counts(static_cast<size_t>(n * chunks), -1);
      world.all_to_all_v(send.data.data(), send.counts.data(), chunks, out.data(), counts.data(),
                         static_cast<int64_t>(out.size()));
      EXPECT_EQ(counts, want.counts);
      EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + want.data.size()), want.data);
      for (size_t i = want.data.size(); i < out.size(); ++i) EXPECT_EQ(out[i], -1.0f);
    }
  }
  set_mpi_wait_mode(MpiWaitMode::kBackoff);
  // An output too small is refused before any data moves, on every rank alike here.
  const std::vector<int64_t> counts(static_cast<size_t>(n), 3);
  const std::vector<float> in(static_cast<size_t>(3 * n), 1.0f);
  std::vector<float> out(2);
  std::vector<int64_t> received(static_cast<size_t>(n));
  try {
    world.all_to_all_v(in.data(), counts.data(), 1, out.data(), received.data(), 2);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
    EXPECT_EQ(std::string(error.what()), "world: all_to_all_v receives " + std::to_string(3 * n) +
                                             " elements into a buffer of 2");
  }
}

TEST(CommCollectives, AllReduceHandlesCountsNotDivisibleBySizeAndBelowIt) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);
  for (int64_t count : {1, 3, 5, 7, 10}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    std::vector<float> data(count);
    data[0] = order_sensitive_value(r);
    for (int64_t i = 1; i < count; ++i) data[i] = 10.0f * i + r;
    world.all_reduce_sum(data.data(), count);
    EXPECT_TRUE(same_bits(data[0], order_sensitive_sum(n))) << data[0];
    for (int64_t i = 1; i < count; ++i) EXPECT_EQ(data[i], n * 10.0f * i + rank_sum) << i;
  }
  std::vector<float> untouched = {5.0f};
  world.all_reduce_sum(untouched.data(), 0);
  EXPECT_EQ(untouched[0], 5.0f);
}

TEST(CommCollectives, AllReduceMaxAgreesOnTheLargestValue) {
  // What the trainer's agreements use (runtime/train/rank_agreement.h): the largest value,
  // on every rank; values beyond 32 bits survive.
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  EXPECT_EQ(world.all_reduce_max(r), n - 1);
  EXPECT_EQ(world.all_reduce_max(r == 0 ? int64_t{1} << 40 : -r), int64_t{1} << 40);
  EXPECT_EQ(world.all_reduce_max(0), 0);
}

TEST(CommCollectives, GroupOfOneCopiesWithoutMpi) {
  // tp = world size: the dp and pp groups hold one member.
  ProcessGroups groups(placement_of(world_size(), 1, 1), world_rank());
  Communicator& dp = groups.group(ParallelDim::kDp, CommSlot::kMain);
  ASSERT_EQ(dp.size(), 1);
  EXPECT_EQ(dp.rank(), 0);
  const std::vector<float> in = {-0.0f, 2.5f};
  std::vector<float> out(2, 9.0f);
  dp.all_gather(in.data(), 2, out.data());
  EXPECT_TRUE(same_bits(out[0], -0.0f));
  EXPECT_EQ(out[1], 2.5f);
  std::fill(out.begin(), out.end(), 9.0f);
  dp.reduce_scatter_sum(in.data(), 2, out.data());
  EXPECT_TRUE(same_bits(out[0], -0.0f));
  EXPECT_EQ(out[1], 2.5f);
  std::vector<float> inout = in;
  dp.all_reduce_sum(inout.data(), 2);
  EXPECT_TRUE(same_bits(inout[0], -0.0f));
  dp.barrier();
}

TEST(CommCollectives, NegativeZeroSurvivesAMultiMemberSum) {
  // Starting the sum from member 0's block, not from +0, keeps (-0) + (-0) = -0.
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  std::vector<float> data = {-0.0f, -0.0f, -0.0f};
  groups.world(CommSlot::kMain).all_reduce_sum(data.data(), 3);
  for (float value : data) EXPECT_TRUE(same_bits(value, -0.0f));
}

TEST(CommCollectives, CountsAboveIntMaxAreRefusedBeforeAnyTransfer) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t too_many = int64_t{INT_MAX} + 1;
  try {
    world.all_gather(nullptr, too_many, nullptr);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_STREQ(error.what(),
                 "world: all_gather of 2147483648 elements per rank exceeds MPI's count limit "
                 "of 2147483647");
  }
  EXPECT_THROW(world.reduce_scatter_sum(nullptr, too_many, nullptr), Error);
  // all_reduce splits the count over the members: only blocks above INT_MAX are refused.
  EXPECT_THROW(world.all_reduce_sum(nullptr, too_many * world.size()), Error);
  EXPECT_THROW(world.start_send(nullptr, too_many, world_rank(), 0), Error);
}

TEST(CommGroups, TpAndPpGroupsFollowThePlacement) {
  // 4 ranks: tp = 2, pp = 2, rank = tp_rank + 2 pp_rank: tp {0,1} {2,3}, pp {0,2} {1,3}.
  // 2 ranks: tp = 2, pp = 1: tp {0,1}, pp {r}.
  const int64_t n = world_size(), r = world_rank();
  ASSERT_TRUE(n == 2 || n == 4) << "run under 2 or 4 ranks";
  ProcessGroups groups(placement_of(2, 1, n / 2), r);
  const std::vector<float> tp_members =
      n == 4 ? std::vector<float>{r < 2 ? 0.0f : 2.0f, r < 2 ? 1.0f : 3.0f}
             : std::vector<float>{0.0f, 1.0f};
  const std::vector<float> pp_members =
      n == 4 ? std::vector<float>{r % 2 + 0.0f, r % 2 + 2.0f} : std::vector<float>{r + 0.0f};
  for (CommSlot slot : {CommSlot::kMain, CommSlot::kLocalComm, CommSlot::kCrossComm}) {
    SCOPED_TRACE(comm_slot_name(slot));
    Communicator& tp = groups.group(ParallelDim::kTp, slot);
    Communicator& pp = groups.group(ParallelDim::kPp, slot);
    EXPECT_EQ(tp.name(), "tp");
    EXPECT_EQ(pp.name(), "pp");
    EXPECT_EQ(groups.group(ParallelDim::kDp, slot).size(), 1);
    EXPECT_EQ(tp.rank(), r % 2);
    EXPECT_EQ(pp.rank(), n == 4 ? r / 2 : 0);

    const float own = static_cast<float>(r);
    std::vector<float> gathered(tp.size());
    tp.all_gather(&own, 1, gathered.data());
    EXPECT_EQ(gathered, tp_members);
    gathered.assign(pp.size(), -1.0f);
    pp.all_gather(&own, 1, gathered.data());
    EXPECT_EQ(gathered, pp_members);
  }
  EXPECT_EQ(groups.world(CommSlot::kCrossComm).size(), n);
  EXPECT_EQ(
      dynamic_cast<MpiCommunicator&>(groups.group(ParallelDim::kTp, CommSlot::kMain)).world_ranks(),
      (std::vector<int64_t>{tp_members[0] == 0.0f ? 0 : 2, tp_members[0] == 0.0f ? 1 : 3}));
  EXPECT_EQ(groups.group(ParallelDim::kCp, CommSlot::kMain).size(), 1);
  EXPECT_EQ(groups.group(ParallelDim::kEp, CommSlot::kMain).size(), 1);
}

Placement placement_with_cp(int64_t tp, int64_t cp, int64_t dp) {
  ParallelSpec parallel;
  parallel.tp = tp;
  parallel.cp = cp;
  parallel.dp = dp;
  return Placement(parallel, /*gpus_per_node=*/4);
}

// The CP ring (runtime/model/layer_ops_cp.h): each member receives its predecessor's block,
// successive exchanges match in call order, in both wait modes, on every slot.
TEST(CommRing, RingExchangeReceivesThePreviousMembersBlockInCallOrder) {
  const int64_t n = world_size(), r = world_rank();
  ASSERT_TRUE(n == 2 || n == 4) << "run under 2 or 4 ranks";
  // tp = 2 when there are 4 ranks: rank = tp + 2 cp, CP groups {0, 2} and {1, 3}.
  const int64_t tp = n == 4 ? 2 : 1, cp = n / tp;
  ProcessGroups groups(placement_with_cp(tp, cp, 1), r);
  for (MpiWaitMode mode : {MpiWaitMode::kSpin, MpiWaitMode::kBackoff}) {
    set_mpi_wait_mode(mode);
    for (CommSlot slot : {CommSlot::kMain, CommSlot::kLocalComm, CommSlot::kCrossComm}) {
      SCOPED_TRACE(comm_slot_name(slot));
      Communicator& ring = groups.group(ParallelDim::kCp, slot);
      ASSERT_EQ(ring.size(), cp);
      EXPECT_EQ(ring.rank(), r / tp);
      const int64_t previous = (ring.rank() + cp - 1) % cp * tp + r % tp;  // world rank
      // Three exchanges of different sizes; the i-th receives the i-th of the previous.
      for (int64_t count : {int64_t{5}, int64_t{1}, int64_t{3000}}) {
        std::vector<float> sent(static_cast<size_t>(count)), got(sent.size(), -1.0f);
        for (int64_t i = 0; i < count; ++i) sent[static_cast<size_t>(i)] = 1000.0f * r + i + count;
        ring.ring_exchange(sent.data(), got.data(), count);
        EXPECT_EQ(got.front(), 1000.0f * previous + count);
        EXPECT_EQ(got.back(), 1000.0f * previous + 2 * count - 1);
      }
    }
  }
  set_mpi_wait_mode(MpiWaitMode::kBackoff);
  // A group of one copies.
  ProcessGroups single(placement_with_cp(n, 1, 1), r);
  const float one = 7.0f;
  float back = 0.0f;
  single.group(ParallelDim::kCp, CommSlot::kMain).ring_exchange(&one, &back, 1);
  EXPECT_EQ(back, 7.0f);
}

// Dense gradients are summed over DP x CP: the ranks of one TP coordinate and stage.
TEST(CommGroups, GradientGroupIsDpTimesCp) {
  const int64_t n = world_size(), r = world_rank();
  ASSERT_TRUE(n == 2 || n == 4) << "run under 2 or 4 ranks";
  // n = 4: tp 1 x cp 2 x dp 2, every rank; n = 2: tp 1 x cp 2, both.
  ProcessGroups all(placement_with_cp(1, 2, n / 2), r);
  const float own = static_cast<float>(r);
  std::vector<float> members(static_cast<size_t>(all.gradient_group().size()), -1.0f);
  all.gradient_group().all_gather(&own, 1, members.data());
  EXPECT_EQ(members, n == 4 ? (std::vector<float>{0, 1, 2, 3}) : (std::vector<float>{0, 1}));
  if (n == 4) {
    // tp 2 x cp 2: {0, 2} and {1, 3}, as dp_cp_members says.
    ProcessGroups pairs(placement_with_cp(2, 2, 1), r);
    members.assign(2, -1.0f);
    pairs.gradient_group().all_gather(&own, 1, members.data());
    EXPECT_EQ(members, (std::vector<float>{r % 2 + 0.0f, r % 2 + 2.0f}));
    EXPECT_EQ(dp_cp_members(placement_with_cp(2, 2, 1), r),
              (std::vector<int64_t>{r % 2, r % 2 + 2}));
  }
  // cp = 1: the DP group itself.
  ProcessGroups plain(placement_of(1, n, 1), r);
  EXPECT_EQ(&plain.gradient_group(), &plain.group(ParallelDim::kDp, CommSlot::kMain));
}

TEST(CommGroups, EpGroupsSplitTheDpBlockAndExpertDataParallelGroupsCrossThem) {
  // dp = n, ep = 2: EP groups {0,1} {2,3}; expert-dp groups {0,2} {1,3} (n = 4) or {r} (n = 2).
  const int64_t n = world_size(), r = world_rank();
  ASSERT_TRUE(n == 2 || n == 4) << "run under 2 or 4 ranks";
  ParallelSpec parallel;
  parallel.dp = n;
  parallel.ep = 2;
  const Placement placement(parallel, /*gpus_per_node=*/4);
  ProcessGroups groups(placement, r);
  const std::vector<int64_t> expert_dp = ProcessGroups::expert_data_parallel_ranks(placement, r);
  const std::vector<int64_t> want_expert_dp =
      n == 4 ? std::vector<int64_t>{r % 2, r % 2 + 2} : std::vector<int64_t>{r};
  EXPECT_EQ(expert_dp, want_expert_dp);
  for (CommSlot slot : {CommSlot::kMain, CommSlot::kLocalComm, CommSlot::kCrossComm}) {
    Communicator& ep = groups.group(ParallelDim::kEp, slot);
    EXPECT_EQ(ep.name(), "ep");
    EXPECT_EQ(ep.size(), 2);
    EXPECT_EQ(ep.rank(), r % 2);
    EXPECT_EQ(groups.group(ParallelDim::kDp, slot).size(), n);
  }
  Communicator& edp = groups.expert_data_parallel();
  EXPECT_EQ(edp.name(), "expert-dp");
  EXPECT_EQ(edp.size(), n / 2);
  float own = static_cast<float>(r);
  std::vector<float> gathered(static_cast<size_t>(edp.size()));
  edp.all_gather(&own, 1, gathered.data());
  const std::vector<float> want_gathered =
      n == 4 ? std::vector<float>{r % 2 + 0.0f, r % 2 + 2.0f} : std::vector<float>{own};
  EXPECT_EQ(gathered, want_gathered);
}

TEST(CommGroups, WorldSizeMismatchNamesBothCounts) {
  const int64_t n = world_size();
  ASSERT_TRUE(n == 2 || n == 4) << "run under 2 or 4 ranks";
  try {
    ProcessGroups groups(placement_of(2, 1, n), world_rank());
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(),
                 n == 4 ? "the plan needs 8 ranks (dp 1 x tp 2 x pp 4), mpirun started 4"
                        : "the plan needs 4 ranks (dp 1 x tp 2 x pp 2), mpirun started 2");
  }
}

TEST(CommThreads, TwoSlotsRunCollectivesAtTheSameTime) {
  // The two communication-stream threads of DHelix: one all-gathers while the other
  // reduce-scatters, each on its own slot's communicator, many times over.
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& gather_comm = groups.world(CommSlot::kLocalComm);
  Communicator& scatter_comm = groups.world(CommSlot::kCrossComm);
  const int64_t n = world_size(), r = world_rank(), kIterations = 200, kCount = 64;
  int64_t gather_errors = 0, scatter_errors = 0;

  std::thread gatherer([&] {
    std::vector<float> in(kCount), out(n * kCount);
    for (int64_t it = 0; it < kIterations; ++it) {
      for (int64_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(it * 1000 + r * 100 + i);
      gather_comm.all_gather(in.data(), kCount, out.data());
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < kCount; ++i) {
          if (out[j * kCount + i] != static_cast<float>(it * 1000 + j * 100 + i)) ++gather_errors;
        }
      }
    }
  });
  std::thread scatterer([&] {
    std::vector<float> in(n * kCount), out(kCount);
    for (int64_t it = 0; it < kIterations; ++it) {
      for (int64_t k = 0; k < n * kCount; ++k) in[k] = static_cast<float>(it + k + r);
      scatter_comm.reduce_scatter_sum(in.data(), kCount, out.data());
      for (int64_t i = 0; i < kCount; ++i) {
        const float expected = static_cast<float>(n * (it + r * kCount + i) + n * (n - 1) / 2);
        if (out[i] != expected) ++scatter_errors;
      }
    }
  });
  gatherer.join();
  scatterer.join();
  EXPECT_EQ(gather_errors, 0);
  EXPECT_EQ(scatter_errors, 0);
}

TEST(CommPointToPoint, TaggedTransfersMatchByTagAndMayBeWaitedOutOfOrder) {
  ProcessGroups groups(placement_of(1, world_size(), 1), world_rank());
  Communicator& world = groups.world(CommSlot::kMain);
  const int64_t n = world.size(), r = world.rank();
  const int64_t next = (r + 1) % n, previous = (r + n - 1) % n;
  const std::vector<int64_t> tags = {7, 8, 9};
  // Message of tag t from rank s: {1000 s + t, 1000 s + t + 0.5}.
  std::vector<std::vector<float>> outgoing, incoming(3, std::vector<float>(2, -1.0f));
  for (int64_t tag : tags) {
    outgoing.push_back({1000.0f * r + tag, 1000.0f * r + tag + 0.5f});
  }
  // Receives posted in tag order 9, 7, 8; sends in 7, 8, 9; waits in yet another order.
  auto recv9 = world.start_recv(incoming[2].data(), 2, previous, 9);
  auto recv7 = world.start_recv(incoming[0].data(), 2, previous, 7);
  auto recv8 = world.start_recv(incoming[1].data(), 2, previous, 8);
  std::vector<std::unique_ptr<TransferRequest>> sends;
  for (size_t k = 0; k < tags.size(); ++k) {
    sends.push_back(world.start_send(outgoing[k].data(), 2, next, tags[k]));
  }
  recv8->wait();
  recv9->wait();
  recv7->wait();
  recv7->wait();  // a second wait returns at once
  for (size_t k = 0; k < tags.size(); ++k) {
    EXPECT_EQ(incoming[k], (std::vector<float>{1000.0f * previous + tags[k],
                                               1000.0f * previous + tags[k] + 0.5f}));
  }
  sends[2]->wait();
  sends.clear();  // the destructors wait for the other two
}

TEST(CommPointToPoint, GroupCommunicatorsTakeWorldRanksAsPeers) {
  // tp groups of tp = 2 are world-rank pairs {0,1} (and {2,3}); partners exchange.
  const int64_t r = world_rank(), partner = r ^ 1;
  ProcessGroups groups(placement_of(2, world_size() / 2, 1), r);
  Communicator& tp = groups.group(ParallelDim::kTp, CommSlot::kCrossComm);
  float sent = 10.0f + r, received = -1.0f;
  auto recv = tp.start_recv(&received, 1, partner, 3);
  auto send = tp.start_send(&sent, 1, partner, 3);
  send->wait();
  recv->wait();
  EXPECT_EQ(received, 10.0f + partner);
}

TEST(CommPointToPoint, RejectsTagsOutOfRangeAndPeersOutsideTheGroup) {
  const int64_t n = world_size(), r = world_rank();
  ProcessGroups groups(placement_of(2, n / 2, 1), r);
  auto& world = dynamic_cast<MpiCommunicator&>(groups.world(CommSlot::kMain));
  void* attribute = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attribute, &found);
  ASSERT_TRUE(found);
  const int64_t upper = *static_cast<int*>(attribute);
  EXPECT_EQ(world.tag_upper_bound(), upper);
  EXPECT_GE(upper, 32767);
  float value = 0.0f;
  for (int64_t tag : {int64_t{-1}, upper + 1}) {
    try {
      world.start_send(&value, 1, r, tag);
      FAIL() << "no error for tag " << tag;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInternal);
      EXPECT_EQ(std::string(error.what()), "world: tag " + std::to_string(tag) +
                                               " is outside MPI's range [0, " +
                                               std::to_string(upper) + "]");
    }
  }
  // dp groups: {r} on 2 ranks, {r % 2, r % 2 + 2} on 4; the tp partner r ^ 1 is in neither.
  Communicator& dp = groups.group(ParallelDim::kDp, CommSlot::kMain);
  const std::string members =
      n == 4 ? std::to_string(r % 2) + ", " + std::to_string(r % 2 + 2) : std::to_string(r);
  try {
    dp.start_recv(&value, 1, r ^ 1, 0);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "dp: world rank " + std::to_string(r ^ 1) +
                                             " is not a member of this group (world ranks " +
                                             members + ")");
  }
}

TEST(CommEnvironment, ChecksNameTheCallTheRankAndMpisText) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE) << mpi_thread_level_name(provided);
  EXPECT_STREQ(mpi_thread_level_name(MPI_THREAD_FUNNELED), "MPI_THREAD_FUNNELED");
  EXPECT_STREQ(mpi_thread_level_name(MPI_THREAD_MULTIPLE), "MPI_THREAD_MULTIPLE");

  EXPECT_NO_THROW(check_mpi(MPI_SUCCESS, "MPI_Barrier"));
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(MPI_ERR_TAG, text, &length);
  try {
    check_mpi(MPI_ERR_TAG, "MPI_Isend");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
    EXPECT_EQ(std::string(error.what()), "MPI_Isend failed on rank " +
                                             std::to_string(world_rank()) + ": " +
                                             std::string(text, length));
  }
  // MPI_ERRORS_RETURN is on: a bad call comes back as an Error instead of killing the job.
  float value = 0.0f;
  EXPECT_THROW(check_mpi(MPI_Send(&value, 1, MPI_FLOAT, static_cast<int>(world_size()) + 5, 0,
                                  MPI_COMM_WORLD),
                         "MPI_Send"),
               Error);
}

}  // namespace
}  // namespace dhelix::rt
