#pragma once
// What the tests of one example plan's simulated run share (simulated_run.h): the plan and
// its job read once per test suite, two iterations simulated once per execution mode, and
// the readers of the recorded calls (which group a communicator serves, its members, where
// a marker stands, how many collectives of a group a program holds).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"
#include "tests/device/simulated_run.h"

namespace dhelix::cuda::testing {

/// examples/plans/NAME.json, its job, and its simulated runs (two iterations a mode).
class ExampleRuns {
 public:
  explicit ExampleRuns(const std::string& name)
      : plan_(read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json")),
        job_(job_from_plan(plan_, name)) {}
  const Plan& plan() const { return plan_; }
  const JobSpec& job() const { return job_; }
  /// Every rank's record of two iterations of `mode`, simulated on first use.
  const std::vector<RankRecord>& run(ExecutionMode mode) {
    auto it = records_.find(mode);
    if (it == records_.end()) it = records_.emplace(mode, simulate_run(plan_, job_, mode, 2)).first;
    return it->second;
  }

 private:
  Plan plan_;
  JobSpec job_;
  std::map<ExecutionMode, std::vector<RankRecord>> records_;
};

/// A test suite over both execution modes sharing one ExampleRuns: the example is
/// `Suite::kExample`, e.g.
///   class SimulatedCpRun : public ExampleRunSuite<SimulatedCpRun> {
///    public:
///     static constexpr const char* kExample = "tiny-cp2-tp2";
///   };
template <class Suite>
class ExampleRunSuite : public ::testing::TestWithParam<ExecutionMode> {
 protected:
  static void SetUpTestSuite() { runs_ = new ExampleRuns(Suite::kExample); }
  static void TearDownTestSuite() {
    delete runs_;
    runs_ = nullptr;
  }
  /// Every rank's record of the test's mode.
  const std::vector<RankRecord>& run() { return runs_->run(GetParam()); }
  static inline ExampleRuns* runs_ = nullptr;
};

/// The group each communicator handle of a rank was created for ("cp (local_comm) ranks
/// 0,2", "dp x cp ranks 0,2", "pp 0->1"), without the member suffix the fake adds.
inline std::map<int64_t, std::string> comm_labels(const RankRecord& r) {
  std::map<int64_t, std::string> labels;
  for (const DeviceCall& call : r.calls) {
    if (call.kind == DeviceCall::Kind::kCommInit) {
      labels[call.comm] = call.label.substr(0, call.label.find(" member "));
    }
  }
  return labels;
}

/// The world ranks a label ends with ("... ranks 0,2"); none without "ranks ".
inline std::vector<int64_t> members_of(const std::string& label) {
  const size_t at = label.rfind("ranks ");
  std::vector<int64_t> members;
  if (at == std::string::npos) return members;
  const std::string rest = label.substr(at + 6);
  size_t start = 0;
  while (start < rest.size()) {
    const size_t comma = rest.find(',', start);
    members.push_back(std::stoll(rest.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return members;
}

/// The index of the marker call `label` in `calls`, or calls.size().
inline size_t marker(const std::vector<DeviceCall>& calls, const std::string& label) {
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].kind == DeviceCall::Kind::kMark && calls[i].label == label) return i;
  }
  return calls.size();
}

/// The collectives of `group` in `rank`'s program of `mode`.
inline int64_t collectives_of(const Plan& plan, const JobSpec& job, int64_t rank,
                              ExecutionMode mode, ParallelDim group) {
  const RankProgram program = lower_rank_program(plan, job, rank, mode);
  return std::count_if(
      program.instructions.begin(), program.instructions.end(), [group](const Instruction& i) {
        return i.kind == InstructionKind::kCollective && i.group && *i.group == group;
      });
}

/// The calls of iteration `k` of `r` (1, 2, ...) from its first event record to its last (the
/// iteration's start and end events) whose kind is not in `allowed`, named for a failure
/// message ("rank 1, iteration 2: synchronize"); with no record at all, one line saying so.
inline std::vector<std::string> calls_outside(const RankRecord& r, int64_t k,
                                              const std::set<DeviceCall::Kind>& allowed) {
  using Kind = DeviceCall::Kind;
  const size_t begin = marker(r.calls, "iteration " + std::to_string(k));
  size_t end = begin + 1;
  while (end < r.calls.size() && r.calls[end].kind != Kind::kMark) ++end;
  size_t first = end, last = begin;
  for (size_t i = begin; i < end; ++i) {
    if (r.calls[i].kind != Kind::kRecord) continue;
    first = std::min(first, i);
    last = i;
  }
  const std::string where = "rank " + std::to_string(r.rank) + ", iteration " + std::to_string(k);
  if (first >= last) return {where + ": no start and end event recorded"};
  std::vector<std::string> outside;
  for (size_t i = first; i <= last; ++i) {
    if (!allowed.contains(r.calls[i].kind)) {
      outside.push_back(where + ": " + device_call_name(r.calls[i].kind));
    }
  }
  return outside;
}

/// What an iteration of a program with NCCL groups and device copies (CP, EP) may ask of
/// the device: enqueueing calls only, no host wait.
inline const std::set<DeviceCall::Kind>& enqueueing_calls() {
  using Kind = DeviceCall::Kind;
  static const std::set<Kind> calls = {Kind::kRecord,   Kind::kWait,       Kind::kKernel,
                                       Kind::kGemm,     Kind::kCollective, Kind::kSend,
                                       Kind::kRecv,     Kind::kDelay,      Kind::kGroupStart,
                                       Kind::kGroupEnd, Kind::kCopy};
  return calls;
}

/// (communicator label, from member, to member) -> (count, dtype) of each call, in enqueue
/// order: what NCCL matches between a member's sends and its peer's receives.
using PointToPointLog =
    std::map<std::tuple<std::string, int64_t, int64_t>, std::vector<std::pair<int64_t, int>>>;
struct PointToPointCalls {
  PointToPointLog sent, received;  ///< equal when every send has its receive, call for call
};

/// Every rank's sends and receives in `records` on the communicators whose label `keep`
/// accepts, from the marker call `from_marker` on ("": every call).
template <class Keep>
PointToPointCalls point_to_point_calls(const std::vector<RankRecord>& records, Keep keep,
                                       const std::string& from_marker = "") {
  PointToPointCalls out;
  for (const RankRecord& r : records) {
    const std::map<int64_t, std::string> labels = comm_labels(r);
    const size_t begin = from_marker.empty() ? 0 : marker(r.calls, from_marker);
    for (size_t i = begin; i < r.calls.size(); ++i) {
      const DeviceCall& call = r.calls[i];
      if (call.kind != DeviceCall::Kind::kSend && call.kind != DeviceCall::Kind::kRecv) continue;
      const std::string& label = labels.at(call.comm);
      if (!keep(label)) continue;
      const std::vector<int64_t> members = members_of(label);
      const int64_t me = std::find(members.begin(), members.end(), r.rank) - members.begin();
      const std::pair<int64_t, int> transfer{call.count, static_cast<int>(call.dtype)};
      if (call.kind == DeviceCall::Kind::kSend)
        out.sent[{label, me, call.value}].push_back(transfer);
      if (call.kind == DeviceCall::Kind::kRecv) {
        out.received[{label, call.value, me}].push_back(transfer);
      }
    }
  }
  return out;
}

}  // namespace dhelix::cuda::testing
