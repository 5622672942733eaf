// The CP ring step and the EP all-to-all on NCCL (runtime/cuda/nccl_communicator.h), on the
// recording fake device: every member of a group gets its own RecordingDevice and
// DeviceCommunicator, and the tests check what each would have asked of NCCL (grouping,
// peers, counts, buffers, element types, the stream and the communicator) and that the
// members' point-to-point calls pair up: NCCL matches a member's sends to a peer with that
// peer's receives from it in enqueue order, so for every ordered pair the two lists must
// agree call for call in count and type, or a real run hangs or corrupts data.

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/nccl_communicator.h"
#include "tests/device/recording_device.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

// One group of `size` members, each on its own recording device.
struct Group {
  explicit Group(int64_t size) {
    for (int64_t r = 0; r < size; ++r) {
      devices.push_back(std::make_unique<RecordingDevice>());
      comms.push_back(
          std::make_unique<DeviceCommunicator>(*devices.back(), size, r, "cp", [](CommId&) {}));
      stream.push_back(devices.back()->create_stream(true));
    }
  }
  // The calls after the set-up (init, stream creation), for member r.
  std::vector<DeviceCall> enqueued(int64_t r) const {
    std::vector<DeviceCall> out;
    for (const DeviceCall& call : devices[static_cast<size_t>(r)]->calls()) {
      if (call.kind != Kind::kCommInit && call.kind != Kind::kCreateStream &&
          call.kind != Kind::kUniqueId) {
        out.push_back(call);
      }
    }
    return out;
  }
  std::vector<std::unique_ptr<RecordingDevice>> devices;
  std::vector<std::unique_ptr<DeviceCommunicator>> comms;
  std::vector<StreamHandle> stream;
};

// A fake device address: the tests compare addresses, nothing is dereferenced.
template <class T>
T* fake(int64_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

struct Transfer {
  int64_t count = 0;
  DeviceDtype dtype = DeviceDtype::kFloat32;
  bool operator==(const Transfer&) const = default;
};

// Per ordered pair (from, to): the sends `from` enqueued to `to`, and the receives `to`
// enqueued from `from`, in order. Every send/recv must sit inside a group.
void expect_pairs_match(const Group& g) {
  std::map<std::pair<int64_t, int64_t>, std::vector<Transfer>> sent;
  std::map<std::pair<int64_t, int64_t>, std::vector<Transfer>> received;
  for (int64_t r = 0; r < static_cast<int64_t>(g.devices.size()); ++r) {
    int depth = 0;
    for (const DeviceCall& call : g.enqueued(r)) {
      if (call.kind == Kind::kGroupStart) ++depth;
      if (call.kind == Kind::kGroupEnd) --depth;
      ASSERT_GE(depth, 0);
      ASSERT_LE(depth, 1);
      if (call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        EXPECT_EQ(depth, 1) << "member " << r << ": a point-to-point call outside a group";
        EXPECT_NE(call.value, r) << "member " << r << " sends to itself over NCCL";
        EXPECT_EQ(call.stream, RecordingDevice::id(g.stream[static_cast<size_t>(r)]));
        EXPECT_EQ(call.comm, 1);  // each device's only communicator
      }
      if (call.kind == Kind::kSend) sent[{r, call.value}].push_back({call.count, call.dtype});
      if (call.kind == Kind::kRecv) received[{call.value, r}].push_back({call.count, call.dtype});
    }
    EXPECT_EQ(depth, 0) << "member " << r << ": a group left open";
  }
  EXPECT_EQ(sent, received);
}

TEST(DeviceRingExchange, SendsToTheNextAndReceivesFromThePreviousInOneGroup) {
  constexpr int64_t kCount = 96;
  for (int64_t size : {2, 3, 4}) {
    Group g(size);
    for (int64_t r = 0; r < size; ++r) {
      g.comms[static_cast<size_t>(r)]->ring_exchange(fake<float>(1000 + r), fake<float>(5000 + r),
                                                     kCount, DeviceDtype::kBFloat16,
                                                     g.stream[static_cast<size_t>(r)]);
      const std::vector<DeviceCall> calls = g.enqueued(r);
      ASSERT_EQ(calls.size(), 4u) << "size " << size;
      EXPECT_EQ(calls[0].kind, Kind::kGroupStart);
      EXPECT_EQ(calls[1].kind, Kind::kSend);
      EXPECT_EQ(calls[1].value, (r + 1) % size);
      EXPECT_EQ(calls[1].address, 1000 + r);
      EXPECT_EQ(calls[1].count, kCount);
      EXPECT_EQ(calls[1].dtype, DeviceDtype::kBFloat16);
      EXPECT_EQ(calls[2].kind, Kind::kRecv);
      EXPECT_EQ(calls[2].value, (r + size - 1) % size);
      EXPECT_EQ(calls[2].address, 5000 + r);
      EXPECT_EQ(calls[2].count, kCount);
      EXPECT_EQ(calls[3].kind, Kind::kGroupEnd);
    }
    expect_pairs_match(g);
  }
}

TEST(DeviceRingExchange, SuccessiveStepsPairUpInOrder) {
  // The backward ring's messages differ in size per step (runtime/model/layer_ops_cp.h):
  // the pairing must hold step by step.
  Group g(4);
  for (int64_t step = 0; step < 5; ++step) {
    for (int64_t r = 0; r < 4; ++r) {
      g.comms[static_cast<size_t>(r)]->ring_exchange(fake<float>(64), fake<float>(128),
                                                     10 * (step + 1), DeviceDtype::kFloat32,
                                                     g.stream[static_cast<size_t>(r)]);
    }
  }
  expect_pairs_match(g);
}

TEST(DeviceRingExchange, AGroupOfOneCopiesOnTheStream) {
  Group g(1);
  g.comms[0]->ring_exchange(fake<float>(64), fake<float>(4096), 10, DeviceDtype::kBFloat16,
                            g.stream[0]);
  const std::vector<DeviceCall> calls = g.enqueued(0);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].kind, Kind::kCopy);
  EXPECT_EQ(calls[0].address, 4096);
  EXPECT_EQ(calls[0].value, 64);
  EXPECT_EQ(calls[0].count, 20);  // bytes
  EXPECT_EQ(calls[0].stream, RecordingDevice::id(g.stream[0]));
}

TEST(DeviceAllToAllV, PaddedBlocksAndCountsPerPeerAtTheirOffsets) {
  constexpr int64_t kSize = 3, kChunks = 2, kCapacity = 40;
  constexpr int64_t kIn = 1 << 20, kOut = 2 << 20, kSendCounts = 3 << 20, kRecvCounts = 4 << 20;
  Group g(kSize);
  for (int64_t r = 0; r < kSize; ++r) {
    g.comms[static_cast<size_t>(r)]->all_to_all_v(
        fake<float>(kIn), fake<int64_t>(kSendCounts), kChunks, fake<float>(kOut),
        fake<int64_t>(kRecvCounts), kCapacity, DeviceDtype::kBFloat16,
        g.stream[static_cast<size_t>(r)]);
    const std::vector<DeviceCall> calls = g.enqueued(r);
    // Own counts and block: two copies; then one group of 4 calls per peer.
    ASSERT_EQ(calls.size(), 2u + 2u + 4u * (kSize - 1));
    EXPECT_EQ(calls[0].kind, Kind::kCopy);
    EXPECT_EQ(calls[0].address, kRecvCounts + 8 * r * kChunks);
    EXPECT_EQ(calls[0].value, kSendCounts + 8 * r * kChunks);
    EXPECT_EQ(calls[0].count, 8 * kChunks);
    EXPECT_EQ(calls[1].kind, Kind::kCopy);
    EXPECT_EQ(calls[1].address, kOut + 2 * r * kCapacity);
    EXPECT_EQ(calls[1].value, kIn + 2 * r * kCapacity);
    EXPECT_EQ(calls[1].count, 2 * kCapacity);
    EXPECT_EQ(calls[2].kind, Kind::kGroupStart);
    EXPECT_EQ(calls.back().kind, Kind::kGroupEnd);
    size_t at = 3;
    for (int64_t peer = 0; peer < kSize; ++peer) {
      if (peer == r) continue;
      const DeviceCall& send_counts = calls[at++];
      const DeviceCall& recv_counts = calls[at++];
      const DeviceCall& send_block = calls[at++];
      const DeviceCall& recv_block = calls[at++];
      EXPECT_EQ(send_counts.kind, Kind::kSend);
      EXPECT_EQ(send_counts.value, peer);
      EXPECT_EQ(send_counts.dtype, DeviceDtype::kInt64);
      EXPECT_EQ(send_counts.count, kChunks);
      EXPECT_EQ(send_counts.address, kSendCounts + 8 * peer * kChunks);
      EXPECT_EQ(recv_counts.kind, Kind::kRecv);
      EXPECT_EQ(recv_counts.value, peer);
      EXPECT_EQ(recv_counts.dtype, DeviceDtype::kInt64);
      EXPECT_EQ(recv_counts.address, kRecvCounts + 8 * peer * kChunks);
      EXPECT_EQ(send_block.kind, Kind::kSend);
      EXPECT_EQ(send_block.count, kCapacity);
      EXPECT_EQ(send_block.dtype, DeviceDtype::kBFloat16);
      EXPECT_EQ(send_block.address, kIn + 2 * peer * kCapacity);
      EXPECT_EQ(recv_block.kind, Kind::kRecv);
      EXPECT_EQ(recv_block.count, kCapacity);
      EXPECT_EQ(recv_block.address, kOut + 2 * peer * kCapacity);
    }
  }
  expect_pairs_match(g);
}

TEST(DeviceAllToAllV, AGroupOfOneOnlyCopies) {
  Group g(1);
  g.comms[0]->all_to_all_v(fake<float>(64), fake<int64_t>(128), 4, fake<float>(256),
                           fake<int64_t>(512), 8, DeviceDtype::kFloat32, g.stream[0]);
  const std::vector<DeviceCall> calls = g.enqueued(0);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].kind, Kind::kCopy);
  EXPECT_EQ(calls[1].kind, Kind::kCopy);
  EXPECT_EQ(calls[1].count, 32);
}

// A group of one has no NCCL communicator (nccl_communicator.h): nothing is asked of NCCL,
// not even an id; its collectives are copies on the stream; it has no peer to send to.
TEST(DeviceGroupOfOne, HasNoNcclCommunicatorAndCopiesOnTheStream) {
  Group g(1);
  EXPECT_FALSE(g.comms[0]->has_nccl());
  for (const DeviceCall& call : g.devices[0]->calls()) {
    EXPECT_NE(call.kind, Kind::kCommInit);
    EXPECT_NE(call.kind, Kind::kUniqueId);
  }
  g.comms[0]->all_gather(fake<float>(64), 10, DeviceDtype::kBFloat16, fake<float>(256),
                         g.stream[0]);
  g.comms[0]->reduce_scatter_sum(fake<float>(64), 10, DeviceDtype::kFloat32, fake<float>(512),
                                 g.stream[0]);
  g.comms[0]->all_reduce_sum(fake<float>(64), 10, DeviceDtype::kFloat32, g.stream[0]);
  g.comms[0]->poll();
  const std::vector<DeviceCall> calls = g.enqueued(0);
  ASSERT_EQ(calls.size(), 2u);  // the all-reduce of one member is nothing
  EXPECT_EQ(calls[0].kind, Kind::kCopy);
  EXPECT_EQ(calls[0].address, 256);
  EXPECT_EQ(calls[0].count, 20);  // bytes
  EXPECT_EQ(calls[1].kind, Kind::kCopy);
  EXPECT_EQ(calls[1].address, 512);
  EXPECT_EQ(calls[1].count, 40);
  for (const DeviceCall& call : g.devices[0]->calls()) {
    EXPECT_NE(call.kind, Kind::kCollective);
    EXPECT_NE(call.kind, Kind::kAsyncError);  // nothing to poll
  }
  EXPECT_THROW(g.comms[0]->send(fake<float>(64), 10, DeviceDtype::kFloat32, 0, g.stream[0]), Error);
}

TEST(DeviceRingExchange, RefusedOnAnAbortedCommunicator) {
  Group g(2);
  g.comms[0]->destroy();
  EXPECT_THROW(g.comms[0]->ring_exchange(fake<float>(64), fake<float>(128), 4,
                                         DeviceDtype::kFloat32, g.stream[0]),
               Error);
}

TEST(ModelCommSetup, TpAboveOneDpWithoutCpTheRingAndDpCpWithIt) {
  const auto dims = [](const DeviceCommSetup& setup) {
    std::vector<std::pair<ParallelDim, DeviceStream>> out;
    for (const CollectiveSlot& slot : setup.collectives) out.emplace_back(slot.dim, slot.stream);
    return out;
  };
  using D = ParallelDim;
  using S = DeviceStream;
  ParallelSpec p;
  // A group of one needs no NCCL communicator (nor its NCCL streams): none at tp = 1.
  p.tp = 1;
  EXPECT_EQ(dims(model_comm_setup(p)), (std::vector<std::pair<D, S>>{}));
  EXPECT_EQ(comm_footprint(model_comm_setup(p), {}).communicators, 0);
  p.tp = 2;
  EXPECT_EQ(dims(model_comm_setup(p)),
            (std::vector<std::pair<D, S>>{
                {D::kTp, S::kCompute}, {D::kTp, S::kLocalComm}, {D::kTp, S::kCrossComm}}));
  EXPECT_FALSE(model_comm_setup(p).gradient_group);
  p.dp = 2;
  EXPECT_EQ(dims(model_comm_setup(p)).back(), std::make_pair(D::kDp, S::kCompute));
  EXPECT_FALSE(model_comm_setup(p).gradient_group);
  p.cp = 2;  // the ring on every stream, gradients over DP x CP instead of DP
  EXPECT_EQ(dims(model_comm_setup(p)), (std::vector<std::pair<D, S>>{{D::kTp, S::kCompute},
                                                                     {D::kTp, S::kLocalComm},
                                                                     {D::kTp, S::kCrossComm},
                                                                     {D::kCp, S::kCompute},
                                                                     {D::kCp, S::kLocalComm},
                                                                     {D::kCp, S::kCrossComm}}));
  EXPECT_TRUE(model_comm_setup(p).gradient_group);
  // The footprint counts the gradient group's communicator (its NCCL streams).
  EXPECT_EQ(comm_footprint(model_comm_setup(p), {}).communicators, 7);
  EXPECT_FALSE(model_comm_setup(p).expert_gradient_group);
  // EP: the all-to-alls on every stream after DP, and the expert-data-parallel group.
  ParallelSpec e;
  e.dp = 2;
  e.ep = 2;
  EXPECT_EQ(dims(model_comm_setup(e)), (std::vector<std::pair<D, S>>{{D::kDp, S::kCompute},
                                                                     {D::kEp, S::kCompute},
                                                                     {D::kEp, S::kLocalComm},
                                                                     {D::kEp, S::kCrossComm}}));
  EXPECT_FALSE(model_comm_setup(e).gradient_group);
  EXPECT_TRUE(model_comm_setup(e).expert_gradient_group);
  EXPECT_EQ(model_comm_setup(e).expert_gradient_group_size, 1);  // dp x cp / ep
  // tp = 1: no TP; the expert group of one: no NCCL communicator either.
  EXPECT_EQ(comm_footprint(model_comm_setup(e), {}).communicators, 4);
  e.dp = 4;
  EXPECT_EQ(comm_footprint(model_comm_setup(e), {}).communicators, 5);
  // FSDP (optim_grads_params): the layers' DP gathers and reduce-scatters on every stream,
  // the other gradients over a DP communicator of their own (the gradient group).
  ParallelSpec f;
  f.dp = 4;
  f.use_megatron_fsdp = true;
  f.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  EXPECT_EQ(dims(model_comm_setup(f)),
            (std::vector<std::pair<D, S>>{
                {D::kDp, S::kCompute}, {D::kDp, S::kLocalComm}, {D::kDp, S::kCrossComm}}));
  EXPECT_TRUE(model_comm_setup(f).gradient_group);
  EXPECT_TRUE(model_comm_setup(f).reduction_stream);
  EXPECT_EQ(comm_footprint(model_comm_setup(f), {}).communicators, 4);
  // optim_grads adds no ops to the plan: plain DP's one communicator.
  f.fsdp_sharding = FsdpShardingStrategy::kOptimGrads;
  EXPECT_EQ(dims(model_comm_setup(f)), (std::vector<std::pair<D, S>>{{D::kDp, S::kCompute}}));
  EXPECT_FALSE(model_comm_setup(f).gradient_group);
}

}  // namespace
}  // namespace dhelix::cuda::testing
