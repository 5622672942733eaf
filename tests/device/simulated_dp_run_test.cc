// The CUDA engine's data-parallel gradient reduction (runtime/cuda/device_gradient_reducer.h)
// on the recording fake device: every rank of tiny-dp2-tp2 (DP 2 x TP 2) set up, two
// iterations of the co-executed program with the reducer's hooks, each followed by the
// engine's update ("update <k>"), buckets of 4096 elements (about 23 a rank). What a GPU run
// needs so that the reduction overlaps the backward and sums what the after-iteration path
// sums:
//   1. with --overlap-grad-reduce every bucket's collective is enqueued inside the
//      iteration, the first before the backward's last GEMM; without, all after it (the
//      same check fails on that run: it tells the two apart);
//   2. each bucket's reduction waits for an event recorded right after the instruction that
//      finishes its gradients (neither earlier, which would sum gradients still being
//      written, nor at a later instruction);
//   3. the DP group's members enqueue the same collectives in the same order and sizes;
//   4. the distributed optimizer reduce-scatters each bucket into shards of
//      ceil(elements / 2), zero-padded, steps, and all-gathers shards of that size, last
//      bucket first; every parameter element is in one bucket;
//   5. with --overlap-param-gather the compute stream does not wait for the gathers in the
//      update; the next iteration's ops wait for the gathers of the weights they read, the
//      first before the first GEMM, and no host wait happens in between;
//   6. nothing is allocated once set up, with the overlapped reduction and gathers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/device/example_runs.h"

namespace dhelix::cuda::testing {
namespace {

using Kind = DeviceCall::Kind;

constexpr int64_t kBucket = 4096;

std::vector<RankRecord> run(SimulatedReduction reduction, int64_t iterations = 2) {
  static ExampleRuns example("tiny-dp2-tp2");
  reduction.bucket_elements = kBucket;
  return simulate_run(example.plan(), example.job(), ExecutionMode::kCoExecuted, iterations, "32",
                      reduction);
}

// The calls of the data-parallel group's communicator (the only one whose label starts
// with "dp"), by index in the log.
std::vector<size_t> dp_collectives(const RankRecord& r, size_t begin, size_t end) {
  const std::map<int64_t, std::string> labels = comm_labels(r);
  std::vector<size_t> found;
  for (size_t i = begin; i < end; ++i) {
    const DeviceCall& call = r.calls[i];
    if (call.kind == Kind::kCollective && labels.at(call.comm).starts_with("dp ")) {
      found.push_back(i);
    }
  }
  return found;
}

size_t last_of(const RankRecord& r, Kind kind, size_t begin, size_t end) {
  size_t last = end;
  for (size_t i = begin; i < end; ++i) {
    if (r.calls[i].kind == kind) last = i;
  }
  return last;
}

// Check 1 for iteration 1 of `r`: every bucket's collective inside the iteration, the first
// before the last GEMM. Returns what breaks it ("" when it holds).
std::string reduced_during_backward(const RankRecord& r) {
  const size_t begin = marker(r.calls, "iteration 1"), update = marker(r.calls, "update 1");
  const size_t next = marker(r.calls, "iteration 2");
  const std::vector<size_t> inside = dp_collectives(r, begin, update);
  const std::vector<size_t> after = dp_collectives(r, update, next);
  if (inside.size() != r.buckets.size() || !after.empty()) {
    return std::to_string(inside.size()) + " of " + std::to_string(r.buckets.size()) +
           " buckets reduced inside the iteration, " + std::to_string(after.size()) + " after";
  }
  const size_t last_gemm = last_of(r, Kind::kGemm, begin, update);
  if (inside.front() > last_gemm) return "the first bucket after the backward's last GEMM";
  return "";
}

TEST(SimulatedDpRun, BucketReductionsAreIssuedBeforeTheBackwardEnds) {
  for (const RankRecord& r : run({.overlap = true})) {
    ASSERT_GT(r.buckets.size(), 10u) << "rank " << r.rank;
    EXPECT_EQ(reduced_during_backward(r), "") << "rank " << r.rank;
  }
  // The after-iteration path fails the same check: every bucket after the iteration.
  for (const RankRecord& r : run({.overlap = false})) {
    EXPECT_NE(reduced_during_backward(r), "") << "rank " << r.rank;
    const size_t update = marker(r.calls, "update 1");
    EXPECT_EQ(dp_collectives(r, update, marker(r.calls, "iteration 2")).size(), r.buckets.size());
  }
}

TEST(SimulatedDpRun, EachBucketWaitsForTheEventRecordedAfterItsLastWriter) {
  for (const RankRecord& r : run({.overlap = true, .mark_instructions = true}, 1)) {
    const size_t begin = marker(r.calls, "iteration 1"), update = marker(r.calls, "update 1");
    const std::vector<size_t> reductions = dp_collectives(r, begin, update);
    ASSERT_EQ(reductions.size(), r.buckets.size());
    const int64_t stream = r.calls[reductions.front()].stream;
    int64_t ready_after = 0;  // buckets go in order: one waits for those before it
    for (size_t k = 0; k < reductions.size(); ++k) {
      ready_after = std::max(ready_after, r.last_writers[k]);
      // The reduction stream's last wait before the collective, and that event's record.
      size_t wait = reductions[k];
      while (wait > begin && !(r.calls[wait].kind == Kind::kWait && r.calls[wait].stream == stream))
        --wait;
      size_t record = wait;
      while (record > begin && !(r.calls[record].kind == Kind::kRecord &&
                                 r.calls[record].event == r.calls[wait].event))
        --record;
      ASSERT_GT(record, begin) << "rank " << r.rank << ", bucket " << k;
      // Recorded after the last writer's "done" mark, before any later instruction's.
      const size_t done = marker(r.calls, "done " + std::to_string(ready_after));
      EXPECT_LT(done, record) << "rank " << r.rank << ", bucket " << k << ": issued before "
                              << "instruction " << ready_after << " was enqueued";
      for (size_t i = done + 1; i < record; ++i) {
        EXPECT_NE(r.calls[i].kind, Kind::kMark)
            << "rank " << r.rank << ", bucket " << k << ": issued late, after " << r.calls[i].label;
      }
      EXPECT_NE(r.calls[record].stream, stream) << "recorded on the writer's stream";
    }
  }
}

// Per DP group label, per member: the collectives' (op, count) in enqueue order.
using GroupCalls = std::map<std::string, std::map<int64_t, std::vector<std::string>>>;

GroupCalls dp_group_calls(const std::vector<RankRecord>& records) {
  GroupCalls calls;
  for (const RankRecord& r : records) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    for (size_t i : dp_collectives(r, marker(r.calls, "iteration 1"), r.calls.size())) {
      calls[labels.at(r.calls[i].comm)][r.rank].push_back(std::to_string(r.calls[i].value) + ":" +
                                                          r.calls[i].label);
    }
  }
  return calls;
}

TEST(SimulatedDpRun, TheDpGroupsMembersEnqueueTheSameCollectives) {
  for (const SimulatedReduction& reduction :
       {SimulatedReduction{.overlap = true},
        SimulatedReduction{.overlap = true, .sharded = true, .overlap_gather = true}}) {
    const GroupCalls calls = dp_group_calls(run(reduction));
    EXPECT_EQ(calls.size(), 2u);  // tiny-dp2-tp2: two DP groups of 2
    for (const auto& [label, by_member] : calls) {
      ASSERT_EQ(by_member.size(), 2u) << label;
      EXPECT_EQ(by_member.begin()->second, by_member.rbegin()->second) << label;
    }
  }
}

TEST(SimulatedDpRun, DistributedOptimizerReduceScattersAndGathersEachBucket) {
  for (const RankRecord& r : run({.overlap = true, .sharded = true})) {
    int64_t elements = 0;
    for (const rt::ReductionBucket& b : r.buckets) elements += b.elements;
    EXPECT_EQ(elements, r.parameter_elements) << "rank " << r.rank;
    const size_t begin = marker(r.calls, "iteration 1"), update = marker(r.calls, "update 1");
    const std::vector<size_t> scattered = dp_collectives(r, begin, update);
    const std::vector<size_t> gathered = dp_collectives(r, update, marker(r.calls, "iteration 2"));
    ASSERT_EQ(scattered.size(), r.buckets.size());
    ASSERT_EQ(gathered.size(), r.buckets.size());
    const int64_t stream = r.calls[scattered.front()].stream;
    size_t previous = begin;
    for (size_t k = 0; k < r.buckets.size(); ++k) {
      const int64_t shard = rt::shard_elements(r.buckets[k].elements, 2);
      const DeviceCall& scatter = r.calls[scattered[k]];
      EXPECT_EQ(scatter.value, static_cast<int64_t>(CollectiveOp::kReduceScatterSum));
      EXPECT_EQ(scatter.label, std::to_string(shard)) << "bucket " << k;
      // Packed and zero-padded on the reduction stream: 2 x shard floats copied.
      int64_t packed = 0;
      for (size_t i = previous; i < scattered[k]; ++i) {
        if (r.calls[i].kind == Kind::kCopy && r.calls[i].stream == stream)
          packed += r.calls[i].count;
      }
      EXPECT_EQ(packed, 2 * shard * static_cast<int64_t>(sizeof(float))) << "bucket " << k;
      previous = scattered[k];
      // Gathered last bucket first, shards of the same size.
      const DeviceCall& gather = r.calls[gathered[r.buckets.size() - 1 - k]];
      EXPECT_EQ(gather.value, static_cast<int64_t>(CollectiveOp::kAllGather));
      EXPECT_EQ(gather.label, std::to_string(shard)) << "bucket " << k;
    }
    // AdamW on this rank's shards only, on the reduction stream, before the first gather.
    int64_t steps = 0;
    for (size_t i = update; i < gathered.front(); ++i) {
      steps += r.calls[i].kind == Kind::kKernel && r.calls[i].label == "adamw";
    }
    EXPECT_GE(steps, static_cast<int64_t>(r.buckets.size()) / 2);
  }
}

// The events recorded on the reduction stream after an all-gather in [begin, end).
std::set<int64_t> gather_events(const RankRecord& r, size_t begin, size_t end) {
  std::set<int64_t> events;
  const std::vector<size_t> gathers = dp_collectives(r, begin, end);
  if (gathers.empty()) return events;
  const int64_t stream = r.calls[gathers.front()].stream;
  for (size_t i = gathers.front(); i < end; ++i) {
    if (r.calls[i].kind == Kind::kRecord && r.calls[i].stream == stream) {
      events.insert(r.calls[i].event);
    }
  }
  return events;
}

TEST(SimulatedDpRun, OverlappedGathersAreWaitedForByTheOpsThatReadTheirWeights) {
  for (const bool overlap_gather : {true, false}) {
    for (const RankRecord& r :
         run({.overlap = true, .sharded = true, .overlap_gather = overlap_gather})) {
      const size_t update = marker(r.calls, "update 1"), next = marker(r.calls, "iteration 2");
      const size_t end = marker(r.calls, "update 2");
      const std::set<int64_t> events = gather_events(r, update, next);
      ASSERT_FALSE(events.empty());
      int64_t waited_in_update = 0;
      for (size_t i = update; i < next; ++i) {
        waited_in_update += r.calls[i].kind == Kind::kWait && events.contains(r.calls[i].event);
      }
      size_t first_wait = end;
      for (size_t i = next; i < end && first_wait == end; ++i) {
        if (r.calls[i].kind == Kind::kWait && events.contains(r.calls[i].event)) first_wait = i;
      }
      size_t first_gemm = next;
      while (first_gemm < end && r.calls[first_gemm].kind != Kind::kGemm) ++first_gemm;
      if (!overlap_gather) {
        EXPECT_EQ(waited_in_update, 1) << "rank " << r.rank << ": compute waits for the gathers";
        EXPECT_EQ(first_wait, end) << "rank " << r.rank;
        continue;
      }
      EXPECT_EQ(waited_in_update, 0) << "rank " << r.rank;
      EXPECT_LT(first_wait, first_gemm) << "rank " << r.rank;
      for (size_t i = next; i < end; ++i) {
        EXPECT_NE(r.calls[i].kind, Kind::kSynchronize) << "rank " << r.rank << ", call " << i;
      }
    }
  }
}

TEST(SimulatedDpRun, NoAllocationOnceSetUpWithTheOverlappedReduction) {
  for (const RankRecord& r : run({.overlap = true, .sharded = true, .overlap_gather = true})) {
    const size_t set_up = marker(r.calls, "activations laid out");
    ASSERT_LT(set_up, r.calls.size());
    for (size_t i = set_up; i < r.calls.size(); ++i) {
      EXPECT_NE(r.calls[i].kind, Kind::kAllocate) << "rank " << r.rank << ": an allocation of "
                                                  << r.calls[i].value << " bytes at call " << i;
    }
  }
}

}  // namespace
}  // namespace dhelix::cuda::testing
