// The cpu profiler backend's single-process parts: the timing harness's statistics and
// sample bookkeeping, the pair entry it derives from co-run samples, the op runner's
// coverage of every op of the tiny CPU jobs (with a fake communicator), and the rank-count
// check. The measuring loop itself runs under mpirun in tests/e2e/profile_cpu_test.sh.

#include "profiler/cpu/cpu_backend.h"

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "lib/error.h"
#include "lib/job_reader.h"
#include "profiler/cpu/cpu_op_runner.h"
#include "profiler/cpu/cpu_timing.h"

namespace dhelix::cpu_profile {
namespace {

JobSpec example_job(const std::string& name) {
  return read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/" + name);
}

// ---- sampling --------------------------------------------------------------------

TEST(CpuTiming, SamplesTimeTheBodyOnlyAndDropTheWarmUp) {
  // A fake clock that the body advances by the next duration; before_each costs 100 us,
  // which must not show in the samples.
  double now = 0;
  const std::vector<double> durations = {50, 40, 10, 30, 20};
  size_t run = 0;
  int64_t syncs = 0;
  const std::vector<double> samples = time_samples(
      {.warmup = 2, .samples = 3},
      [&] {
        ++syncs;
        now += 100;
      },
      [&] { now += durations.at(run++); }, [&] { return now; });
  EXPECT_EQ(samples, (std::vector<double>{10, 30, 20}));
  EXPECT_EQ(syncs, 5);
  EXPECT_EQ(run, 5u);
}

// Both bodies of a pair run at the same time. Proven without timing bounds (the machine may
// be loaded): in its k-th run each body counts its arrival and waits, up to a generous
// limit, until 2k arrivals were counted; run one after the other, the first body of every
// pair would wait in vain.
TEST(CpuTiming, PairRunsBothBodiesTogetherOnTwoThreads) {
  int64_t syncs = 0, runs_a = 0, runs_b = 0;
  std::thread::id thread_a, thread_b;
  std::atomic<int64_t> arrivals{0};
  std::atomic<int> met_other{0};
  const auto meet = [&](int64_t run) {
    arrivals.fetch_add(1);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrivals.load() < 2 * run && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (arrivals.load() >= 2 * run) met_other.fetch_add(1);
  };
  const std::vector<PairSample> samples = time_pair_samples(
      {.warmup = 1, .samples = 3}, [&] { ++syncs; },
      [&] {
        ++runs_a;
        thread_a = std::this_thread::get_id();
        meet(runs_a);
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
      },
      [&] {
        ++runs_b;
        thread_b = std::this_thread::get_id();
        meet(runs_b);
        std::this_thread::sleep_for(std::chrono::milliseconds(8));
      },
      steady_clock_us);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(syncs, 4);
  EXPECT_EQ(runs_a, 4);
  EXPECT_EQ(runs_b, 4);
  EXPECT_EQ(thread_a, std::this_thread::get_id());
  EXPECT_NE(thread_b, thread_a);
  EXPECT_EQ(met_other.load(), 8);  // every run of each body met the other one
  for (const PairSample& s : samples) {
    EXPECT_GE(s.finish_a_us, 4000);
    EXPECT_GE(s.finish_b_us, 8000);
  }
}

TEST(CpuTiming, PairRethrowsAFailureAfterBothThreadsFinish) {
  int64_t runs_a = 0, runs_b = 0;
  EXPECT_THROW(time_pair_samples(
                   {.warmup = 0, .samples = 4}, [] {}, [&] { ++runs_a; },
                   [&] {
                     if (++runs_b == 2) throw Error(ErrorCode::kInternal, "MPI_Alltoall failed");
                   },
                   steady_clock_us),
               Error);
  EXPECT_EQ(runs_a, 4);
  EXPECT_EQ(runs_b, 2);  // not called again after it failed
}

// ---- pairs of ops of different lengths -------------------------------------------------

TEST(CpuPairRepeats, TheShorterOpRunsAsLongAsTheLongerLasts) {
  const PairRepeats gemm_beside_collective = pair_repeats(300, 2000);
  EXPECT_EQ(gemm_beside_collective.a, 7);  // round(2000 / 300)
  EXPECT_EQ(gemm_beside_collective.b, 1);
  const PairRepeats collective_beside_norm = pair_repeats(2000, 27);
  EXPECT_EQ(collective_beside_norm.a, 1);
  EXPECT_EQ(collective_beside_norm.b, 74);
  EXPECT_EQ(pair_repeats(500, 500).a, 1);
  EXPECT_EQ(pair_repeats(500, 500).b, 1);
  EXPECT_EQ(pair_repeats(1e6, 1).b, kMaxPairRepeats);
  EXPECT_EQ(pair_repeats(0, 100).a, 1);  // nothing to scale by
  EXPECT_EQ(pair_repeats(0, 100).b, 1);
}

TEST(CpuPairRepeats, SequencesBecomeOneOpOfEachAtTheSameRates) {
  // cpu_timing.h's example: 10 x 100 us at rate 0.8 beside 1 x 1000 us at rate 0.5. The
  // sequences end at 1250 us (a) and 1250 + (1000 - 625) = 1625 us (b).
  const PairSample one = single_op_equivalent({1250, 1625}, 100, 1000, {.a = 10, .b = 1});
  EXPECT_DOUBLE_EQ(one.finish_a_us, 125);     // 100 / 0.8
  EXPECT_DOUBLE_EQ(one.finish_b_us, 1062.5);  // 125 + 1000 - 0.5 * 125
  // The same with the roles swapped.
  const PairSample swapped = single_op_equivalent({1625, 1250}, 1000, 100, {.a = 1, .b = 10});
  EXPECT_DOUBLE_EQ(swapped.finish_a_us, 1062.5);
  EXPECT_DOUBLE_EQ(swapped.finish_b_us, 125);
  // No slowdown: the sequences end at their solo times, and so do the single ops.
  const PairSample alone = single_op_equivalent({1000, 1000}, 100, 1000, {.a = 10, .b = 1});
  EXPECT_DOUBLE_EQ(alone.finish_a_us, 100);
  EXPECT_DOUBLE_EQ(alone.finish_b_us, 1000);
}

TEST(CpuPairRepeats, TheLongOpEndingFirstKeepsItsRate) {
  // One 1000 us op beside 4 x 100 us ops, both at rate 0.2: the sequence of short ops ends
  // first (400 / 0.2 = 2000 us), when the long op had done 1000 - (2600 - 2000) = 400 us.
  const PairSample one = single_op_equivalent({2600, 2000}, 1000, 100, {.a = 1, .b = 4});
  // Single ops: the short one ends at 100 / 0.2 = 500 us, the long one did 0.2 * 500 by then.
  EXPECT_DOUBLE_EQ(one.finish_b_us, 500);
  EXPECT_DOUBLE_EQ(one.finish_a_us, 500 + 1000 - 0.2 * 500);
}

// ---- pair entries ------------------------------------------------------------------

TEST(CpuPair, FinishTimesAreMediansAndOefFollows) {
  PairAdjustment adjustment = PairAdjustment::kCappedAtOefMinusOne;
  const ProfiledPair pair =
      pair_from_samples("a", "b", 100, 50, {{120, 60}, {130, 55}, {110, 70}}, &adjustment);
  EXPECT_EQ(pair.a, "a");
  EXPECT_EQ(pair.b, "b");
  EXPECT_DOUBLE_EQ(pair.finish_a_us, 120);
  EXPECT_DOUBLE_EQ(pair.finish_b_us, 60);
  EXPECT_DOUBLE_EQ(pair.makespan_us, 120);
  EXPECT_DOUBLE_EQ(pair.oef, 0.6);  // (100 + 50 - 120) / 50
  EXPECT_EQ(adjustment, PairAdjustment::kNone);
}

TEST(CpuPair, FinishBelowSoloIsRaisedToSolo) {
  PairAdjustment adjustment = PairAdjustment::kNone;
  const ProfiledPair pair = pair_from_samples("a", "b", 100, 50, {{90, 40}}, &adjustment);
  EXPECT_DOUBLE_EQ(pair.finish_a_us, 100);
  EXPECT_DOUBLE_EQ(pair.finish_b_us, 50);
  EXPECT_DOUBLE_EQ(pair.makespan_us, 100);
  EXPECT_DOUBLE_EQ(pair.oef, 1);
  EXPECT_EQ(adjustment, PairAdjustment::kRaisedToSolo);
}

TEST(CpuPair, MakespanBeyondOefMinusOneIsCapped) {
  PairAdjustment adjustment = PairAdjustment::kNone;
  const ProfiledPair pair = pair_from_samples("a", "b", 100, 50, {{100, 260}}, &adjustment);
  EXPECT_DOUBLE_EQ(pair.finish_a_us, 100);
  EXPECT_DOUBLE_EQ(pair.finish_b_us, 200);  // 100 + 2 * 50
  EXPECT_DOUBLE_EQ(pair.makespan_us, 200);
  EXPECT_DOUBLE_EQ(pair.oef, -1);
  EXPECT_EQ(adjustment, PairAdjustment::kCappedAtOefMinusOne);
}

// ---- op runner ---------------------------------------------------------------------

// A communicator of `size` members seen from group rank 0 that records what it was asked
// to move instead of moving it.
class RecordingCommunicator final : public rt::Communicator {
 public:
  explicit RecordingCommunicator(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  int64_t rank() const override { return 0; }
  const std::string& name() const override { return name_; }
  void all_gather(const float*, int64_t count, float*) override { record("all_gather", count); }
  void reduce_scatter_sum(const float*, int64_t count, float*) override {
    record("reduce_scatter", count);
  }
  void all_reduce_sum(float*, int64_t count) override { record("all_reduce", count); }
  void barrier() override {}
  void ring_exchange(const float*, float*, int64_t count) override {
    record("ring_exchange", count);
  }
  int64_t all_reduce_max(int64_t value) override { return value; }
  void all_to_all_v(const float*, const int64_t* send_counts, int64_t chunks, float*,
                    int64_t* recv_counts, int64_t) override {
    int64_t count = 0;
    for (int64_t i = 0; i < size_ * chunks; ++i) count += send_counts[i];
    std::copy(send_counts, send_counts + size_ * chunks, recv_counts);
    record("all_to_all_v", count);
  }
  std::unique_ptr<rt::TransferRequest> start_send(const float*, int64_t count, int64_t peer,
                                                  int64_t) override {
    record("send to " + std::to_string(peer), count);
    return std::make_unique<Done>();
  }
  std::unique_ptr<rt::TransferRequest> start_recv(float*, int64_t count, int64_t peer,
                                                  int64_t) override {
    record("recv from " + std::to_string(peer), count);
    return std::make_unique<Done>();
  }

  std::map<std::string, int64_t> calls;  ///< "operation" -> count of its last call

 private:
  struct Done final : rt::TransferRequest {
    void wait() override {}
  };
  void record(const std::string& what, int64_t count) { calls[what] = count; }

  int64_t size_;
  std::string name_ = "fake";
};

// Buffer bytes of the runnable of the op with `signature` in tiny-tp2's profile space.
int64_t tiny_buffer_bytes(const std::string& signature) {
  const ProfileSpace space = collect_profile_space(example_job("tiny-tp2.json"));
  RecordingCommunicator comm(2);
  for (const Op& op : space.ops) {
    if (op.signature() == signature) {
      return make_runnable_op(op, {.comm = &comm, .world_ranks = {0, 1}}).buffer_bytes;
    }
  }
  ADD_FAILURE() << "no op " << signature;
  return -1;
}

TEST(CpuOpRunner, BuffersFollowTheOpShapes) {
  // C[128, 64] = A[128, 64] B[64, 64]
  EXPECT_EQ(tiny_buffer_bytes("gemm:fp32:m=128,n=64,k=64"), 4 * (128 * 64 + 64 * 64 + 128 * 64));
  // x and y [64, 64], gain [64], rstd [64]
  EXPECT_EQ(tiny_buffer_bytes("norm.fwd:fp32:rmsnorm:m=64,n=64"), 4 * (2 * 4096 + 2 * 64));
  // q and out [2, 64, 2, 16], k and v [2, 64, 1, 16], lse [2, 2, 64]
  EXPECT_EQ(tiny_buffer_bytes("attention.fwd:fp32:b=2,h=2,g=1,q=64,kv=64,d=16,causal"),
            4 * (2 * 4096 + 2 * 2048 + 256));
  // gate_up [128, 128], out [128, 64]
  EXPECT_EQ(tiny_buffer_bytes("activation.fwd:fp32:swiglu:m=128,n=64"), 4 * (16384 + 8192));
  // logits [128, 128], loss and lse [128], int64 targets [128]
  EXPECT_EQ(tiny_buffer_bytes("loss.fwd:fp32:m=128,n=128"), 4 * (16384 + 256) + 8 * 128);
  // int64 tokens [128], table [128, 64], out [128, 64]
  EXPECT_EQ(tiny_buffer_bytes("embedding.fwd:fp32:m=128,n=64,k=128"), 4 * 16384 + 8 * 128);
  // 32768 bytes gathered: 4096 floats sent, 8192 received
  EXPECT_EQ(tiny_buffer_bytes("all_gather:fp32:bytes=32768:tp2:local"), 4 * (4096 + 8192));
}

TEST(CpuOpRunner, CollectivesMoveTheOpsBytesAsFloats) {
  const ProfileSpace space = collect_profile_space(example_job("tiny-tp2.json"));
  RecordingCommunicator comm(2);
  for (const Op& op : space.ops) {
    if (is_communication(op.kind))
      make_runnable_op(op, {.comm = &comm, .world_ranks = {0, 1}}).run();
  }
  const std::map<std::string, int64_t> expected = {
      {"all_gather", 4096},      // 32768 bytes = 8192 floats, 1/2 per member
      {"reduce_scatter", 4096},  // 8192 floats in, 4096 out
      {"all_reduce", 384},       // 1536 bytes
      {"ring_exchange", 4096},   // ring step of 16384 bytes to the next member and back
  };
  EXPECT_EQ(comm.calls, expected);
}

TEST(CpuOpRunner, FsdpCollectivesOverTheDpGroupRun) {
  // tiny-fsdp-dp4: llama-tiny's 36,992 layer parameters in fp32, 147,968 bytes, gathered
  // and reduce-scattered over dp 4: 9,248 floats a member.
  const ProfileSpace space = collect_profile_space(example_job("tiny-fsdp-dp4.json"));
  RecordingCommunicator comm(4);
  std::set<std::string> dp_ops;
  for (const Op& op : space.ops) {
    if (!is_communication(op.kind) || op.group != ParallelDim::kDp) continue;
    dp_ops.insert(op.signature());
    make_runnable_op(op, {.comm = &comm, .world_ranks = {0, 1, 2, 3}}).run();
  }
  EXPECT_EQ(dp_ops, (std::set<std::string>{"all_gather:fp32:bytes=147968:dp4:local",
                                           "reduce_scatter:fp32:bytes=147968:dp4:local"}));
  const std::map<std::string, int64_t> expected = {{"all_gather", 9248}, {"reduce_scatter", 9248}};
  EXPECT_EQ(comm.calls, expected);
}

TEST(CpuOpRunner, EveryOpOfTheTinyJobsRuns) {
  std::set<std::string> kinds;
  for (const char* name : {"tiny-tp2.json", "tiny-dp2-tp2.json", "tiny-tp2-pp2.json"}) {
    const ProfileSpace space = collect_profile_space(example_job(name));
    for (const Op& op : space.ops) {
      RecordingCommunicator comm(op.group_size);
      const RunnableOp runnable = make_runnable_op(op, {.comm = &comm, .world_ranks = {0, 1}});
      EXPECT_GT(runnable.buffer_bytes, 0) << op.signature();
      runnable.run();
      runnable.run();
      kinds.insert(op_kind_name(op.kind));
    }
  }
  const std::set<std::string> expected = {
      "activation", "all_gather", "all_reduce", "attention", "bias_dropout_add", "embedding",
      "gemm",       "head",       "loss",       "norm",      "reduce_scatter",   "send_recv"};
  EXPECT_EQ(kinds, expected);
}

TEST(CpuOpRunner, OutsideTheGroupACollectiveDoesNothing) {
  Op op;
  op.id = "fwd.allgather_attn";
  op.kind = OpKind::kAllGather;
  op.comm_bytes = 1024;
  op.group_size = 2;
  const RunnableOp runnable = make_runnable_op(op, {});
  EXPECT_EQ(runnable.buffer_bytes, 0);
  runnable.run();
}

TEST(CpuOpRunner, AttentionNeedsWholeKvGroups) {
  Op op;
  op.id = "fwd.flash_attn";
  op.kind = OpKind::kAttention;
  op.shape = {.batch = 1, .heads = 3, .kv_heads = 2, .q_len = 4, .kv_len = 4, .head_dim = 2};
  try {
    make_runnable_op(op, {});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_STREQ(error.what(),
                 "fwd.flash_attn: attention with 3 heads and 2 kv heads: heads must be a "
                 "multiple of kv_heads");
  }
}

// ---- ranks -------------------------------------------------------------------------

TEST(CpuBackend, NeedsAsManyRanksAsTheWidestGroup) {
  const ProfileSpace space = collect_profile_space(example_job("tiny-tp2.json"));
  EXPECT_EQ(cpu_ranks_needed(space), 2);
  EXPECT_NO_THROW(check_cpu_world_size(space, 2));
  try {
    check_cpu_world_size(space, 1);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(),
                 "the cpu backend measures tp-2 collectives with 2 ranks: run mpirun -np 2 "
                 "dhelix-profile ..., or a multiple of 2 (this run has 1 rank)");
  }
  EXPECT_THROW(check_cpu_world_size(space, 3), Error);
  // Two groups of 2 measure at once, as the 4 ranks of a CP 2 x TP 2 run load the host.
  EXPECT_NO_THROW(check_cpu_world_size(space, 4));
}

}  // namespace
}  // namespace dhelix::cpu_profile
