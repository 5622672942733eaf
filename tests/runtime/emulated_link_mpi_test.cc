// Emulated links under mpirun (2 and 4 ranks): each collective and transfer of a process
// group with --emulate-link completes no earlier than the modelled wire time of its ring
// algorithm (lib/link_cost.h: bytes over the rate plus the ring's latency steps), and within a
// tolerance after it; the data arrive as on the real transport; two threads' collectives on
// one kind's link take turns; a receive posted early completes the wire time after the
// late sender's start (the header carries it). runtime/comm/emulated_link.h has the rules.

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/link_cost.h"
#include "lib/parallel_spec.h"
#include "lib/placement.h"
#include "runtime/comm/link_emulation.h"
#include "runtime/comm/process_groups.h"
#include "tests/runtime/mpi_world.h"

namespace dhelix::rt {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

// 25 Mbit/s = 3.125 bytes/us with 100 us per ring step: the 256 KiB blocks take 42-250 ms,
// long against a sleep's wake-up and the exchange over shared memory.
constexpr double kBytesPerUs = 3.125;
constexpr double kLatencyUs = 100;
// A loaded CI machine (other MPI tests beside this one) may wake a sleeping thread late; a
// transfer that ignored the link would end far earlier, one that waited twice at least
// 42 ms later.
constexpr double kToleranceUs = 40000;

using test::world_rank;
using test::world_size;

// Every rank in one TP group (the collectives) and one pipeline world (the transfers), on
// links of 25mbit@100us.
ProcessGroups emulated_groups() {
  ParallelSpec parallel;
  parallel.tp = world_size();
  return ProcessGroups(Placement(parallel, /*gpus_per_node=*/4), world_rank(),
                       LinkEmulation::parse({"25mbit@100us"}));
}

// The hand-computed wire time: latency steps times alpha plus the ring's share of S.
double wire_us(OpKind kind, int64_t n, double bytes) {
  return static_cast<double>(latency_steps(kind, n)) * kLatencyUs +
         bus_bandwidth_factor(kind, n) * bytes / kBytesPerUs;
}

template <typename Body>
double elapsed_us(Body body) {
  const Clock::time_point start = Clock::now();
  body();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

void expect_wire_time(double measured_us, double wire, const char* what) {
  EXPECT_GE(measured_us, wire) << what << ": done before the link could carry it";
  EXPECT_LE(measured_us, wire + kToleranceUs)
      << what << ": " << measured_us - wire << " us after the link was done";
}

TEST(EmulatedLinkMpi, EachCollectiveTakesItsWireTime) {
  ProcessGroups groups = emulated_groups();
  EXPECT_EQ(groups.link_emulation(),
            "tp 25mbit@100us, cp 25mbit@100us, ep 25mbit@100us, dp 25mbit@100us, "
            "pp 25mbit@100us");
  Communicator& tp = groups.group(ParallelDim::kTp, CommSlot::kMain);
  const int64_t n = tp.size(), r = tp.rank();
  ASSERT_EQ(n, world_size());
  const int64_t count = 65536;  // 256 KiB per member
  const double block_bytes = static_cast<double>(count) * sizeof(float);

  std::vector<float> in(static_cast<size_t>(n * count)), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 10 + 1);
  tp.barrier();
  double t = elapsed_us([&] { tp.all_gather(in.data(), count, out.data()); });
  expect_wire_time(t, wire_us(OpKind::kAllGather, n, n * block_bytes), "all_gather");
  for (int64_t j = 0; j < n; ++j) EXPECT_EQ(out[static_cast<size_t>(j * count)], j * 10 + 1);

  tp.barrier();
  t = elapsed_us([&] { tp.reduce_scatter_sum(in.data(), count, out.data()); });
  expect_wire_time(t, wire_us(OpKind::kReduceScatter, n, n * block_bytes), "reduce_scatter_sum");
  EXPECT_EQ(out[0], static_cast<float>(10 * n * (n - 1) / 2 + n));

  tp.barrier();
  t = elapsed_us([&] { tp.all_reduce_sum(in.data(), count); });
  expect_wire_time(t, wire_us(OpKind::kAllReduce, n, block_bytes), "all_reduce_sum");
  EXPECT_EQ(in[0], static_cast<float>(10 * n * (n - 1) / 2 + n));

  tp.barrier();
  t = elapsed_us([&] { tp.ring_exchange(in.data(), out.data(), count); });
  expect_wire_time(t, wire_us(OpKind::kSendRecv, n, block_bytes), "ring_exchange");

  // All-to-all: count elements for each other member, one chunk each.
  std::vector<int64_t> send_counts(static_cast<size_t>(n), count), recv_counts(send_counts.size());
  tp.barrier();
  t = elapsed_us([&] {
    tp.all_to_all_v(in.data(), send_counts.data(), 1, out.data(), recv_counts.data(),
                    static_cast<int64_t>(out.size()));
  });
  expect_wire_time(t, wire_us(OpKind::kAllToAll, n, n * block_bytes), "all_to_all_v");
  EXPECT_EQ(recv_counts[0], count);
}

TEST(EmulatedLinkMpi, TwoThreadsCollectivesOnOneLinkTakeTurns) {
  ProcessGroups groups = emulated_groups();
  Communicator& first = groups.group(ParallelDim::kTp, CommSlot::kLocalComm);
  Communicator& second = groups.group(ParallelDim::kTp, CommSlot::kCrossComm);
  const int64_t n = first.size(), count = 65536;
  std::vector<float> in_a(count, 1.0f), out_a(n * count), in_b(count, 2.0f), out_b(n * count);
  const double one = wire_us(OpKind::kAllGather, n, static_cast<double>(n * count) * 4);
  first.barrier();
  double t_a = 0, t_b = 0;
  const Clock::time_point start = Clock::now();
  std::thread other([&] {
    second.all_gather(in_b.data(), count, out_b.data());
    t_b = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  });
  first.all_gather(in_a.data(), count, out_a.data());
  t_a = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  other.join();
  // One of them went first; the other waited for the link.
  expect_wire_time(std::max(t_a, t_b), 2 * one, "the later of two all-gathers on one link");
  EXPECT_EQ(out_b[0], 2.0f);
}

TEST(EmulatedLinkMpi, AReceivePostedEarlyEndsTheWireTimeAfterTheSendersStart) {
  ProcessGroups groups = emulated_groups();
  Communicator& world = groups.world(CommSlot::kCrossComm);
  const int64_t r = world.rank(), n = world.size();
  const int64_t count = 65536, peer = r ^ 1;  // pairs (0, 1), (2, 3)
  const double wire = wire_us(OpKind::kSendRecv, 2, static_cast<double>(count) * 4);
  constexpr double kSenderLateUs = 20000;
  std::vector<float> data(count, static_cast<float>(r));
  world.barrier();
  if (peer >= n) return;
  // Ranks leave the barrier at slightly different times, so the receiver measures from the
  // sender's own clock reading (one host, one steady clock), sent after the transfer.
  if (r % 2 == 0) {
    std::this_thread::sleep_for(microseconds(static_cast<int64_t>(kSenderLateUs)));
    const Clock::time_point sent = Clock::now();
    double t = elapsed_us([&] { world.start_send(data.data(), count, peer, 7)->wait(); });
    expect_wire_time(t, wire, "send");
    const int64_t sent_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(sent.time_since_epoch()).count();
    MPI_Send(&sent_ns, 1, MPI_INT64_T, static_cast<int>(peer), 8, MPI_COMM_WORLD);
  } else {
    const Clock::time_point posted = Clock::now();
    std::unique_ptr<TransferRequest> receive = world.start_recv(data.data(), count, peer, 7);
    receive->wait();
    const Clock::time_point done = Clock::now();
    int64_t sent_ns = 0;
    MPI_Recv(&sent_ns, 1, MPI_INT64_T, static_cast<int>(peer), 8, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    const Clock::time_point sent{std::chrono::nanoseconds(sent_ns)};
    EXPECT_LT(posted, sent) << "the receive was to be posted before the send";
    expect_wire_time(std::chrono::duration<double, std::micro>(done - sent).count(), wire,
                     "receive posted before the send, from the send's start");
    EXPECT_EQ(data[0], static_cast<float>(peer));
  }
}

}  // namespace
}  // namespace dhelix::rt
