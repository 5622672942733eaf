#include "runtime/train/run_trace.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/json_reader.h"
#include "lib/plan/plan_writer.h"
#include "lib/plan_identity.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/train/memory_timeline.h"

namespace dhelix::rt {
namespace {

constexpr int64_t kTasksTid = 0;
constexpr int64_t kReceiveTid = 4;
constexpr int64_t kStepTid = 5;
constexpr int64_t kBucketTid = 6;
constexpr size_t kHostChars = 256;
// Per step: step, iteration start and end, update start, sync end, update end, op count,
// bucket count.
constexpr size_t kStepHeader = 8;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int world_size() {
  int size = 1;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  return size;
}

// This rank's records as one flat array: origin, step count, then per step its header and
// (ready, start, end) per instruction, then (bucket, start, end, gather) per bucket slice.
std::vector<int64_t> flatten(int64_t origin_ns, const std::vector<StepRecord>& steps) {
  std::vector<int64_t> flat = {origin_ns, static_cast<int64_t>(steps.size())};
  for (const StepRecord& s : steps) {
    flat.insert(flat.end(), {s.step, s.iteration_start_ns, s.iteration_end_ns, s.update_start_ns,
                             s.sync_end_ns, s.update_end_ns, static_cast<int64_t>(s.ops.size()),
                             static_cast<int64_t>(s.buckets.size())});
    for (const OpTiming& op : s.ops) flat.insert(flat.end(), {op.ready_ns, op.start_ns, op.end_ns});
    for (const BucketTiming& b : s.buckets) {
      flat.insert(flat.end(), {b.bucket, b.start_ns, b.end_ns, b.gather ? 1 : 0});
    }
  }
  return flat;
}

std::vector<StepRecord> unflatten(const int64_t* flat, size_t size, int64_t& origin_ns) {
  DHELIX_CHECK(size >= 2);
  origin_ns = flat[0];
  std::vector<StepRecord> steps(static_cast<size_t>(flat[1]));
  size_t at = 2;
  for (StepRecord& s : steps) {
    DHELIX_CHECK(at + kStepHeader <= size);
    s = {flat[at], flat[at + 1], flat[at + 2], flat[at + 3], flat[at + 4], flat[at + 5], {}, {}};
    const auto n = static_cast<size_t>(flat[at + 6]);
    const auto buckets = static_cast<size_t>(flat[at + 7]);
    at += kStepHeader;
    DHELIX_CHECK(at + 3 * n + 4 * buckets <= size);
    s.ops.resize(n);
    for (OpTiming& op : s.ops) {
      op = {flat[at], flat[at + 1], flat[at + 2]};
      at += 3;
    }
    s.buckets.resize(buckets);
    for (BucketTiming& b : s.buckets) {
      b = {flat[at], flat[at + 1], flat[at + 2], flat[at + 3] != 0};
      at += 4;
    }
  }
  return steps;
}

// Everything rank 0 needs from one rank.
struct RankRecords {
  std::string host;
  int64_t origin_ns = 0;
  std::vector<StepRecord> steps;
};

std::vector<RankRecords> gather_at_root(int64_t rank, int64_t origin_ns,
                                        const std::vector<StepRecord>& steps) {
  const int n = world_size();
  std::array<char, kHostChars> host{};
  gethostname(host.data(), host.size() - 1);
  std::vector<char> hosts(rank == 0 ? kHostChars * static_cast<size_t>(n) : 0);
  check_mpi(MPI_Gather(host.data(), kHostChars, MPI_CHAR, hosts.data(), kHostChars, MPI_CHAR, 0,
                       MPI_COMM_WORLD),
            "MPI_Gather");
  const std::vector<int64_t> flat = flatten(origin_ns, steps);
  int count = static_cast<int>(flat.size());
  std::vector<int> counts(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
  check_mpi(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
            "MPI_Gather");
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    offsets[static_cast<size_t>(r)] = static_cast<int>(total);
    total += counts[static_cast<size_t>(r)];
  }
  if (rank == 0 && total > INT32_MAX) {
    throw Error(
        ErrorCode::kUnsupported,
        fmt::format("--trace: {} timestamps exceed MPI's count limit; trace fewer steps", total));
  }
  std::vector<int64_t> all(rank == 0 ? static_cast<size_t>(total) : 0);
  check_mpi(MPI_Gatherv(flat.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                        MPI_INT64_T, 0, MPI_COMM_WORLD),
            "MPI_Gatherv");
  std::vector<RankRecords> records;
  if (rank != 0) return records;
  for (int r = 0; r < n; ++r) {
    RankRecords rr;
    rr.host = std::string(hosts.data() + kHostChars * static_cast<size_t>(r));
    rr.steps = unflatten(all.data() + offsets[static_cast<size_t>(r)],
                         static_cast<size_t>(counts[static_cast<size_t>(r)]), rr.origin_ns);
    records.push_back(std::move(rr));
  }
  return records;
}

OrderedJson metadata(const char* name, int64_t pid, int64_t tid, OrderedJson args) {
  OrderedJson e = {{"name", name}, {"ph", "M"}, {"pid", pid}};
  if (tid >= 0) e["tid"] = tid;
  e["args"] = std::move(args);
  return e;
}

void add_rank_metadata(int64_t rank, int64_t stage, OrderedJson& events) {
  events.push_back(
      metadata("process_name", rank, -1, {{"name", fmt::format("stage {} rank {}", stage, rank)}}));
  events.push_back(metadata("process_sort_index", rank, -1, {{"sort_index", rank}}));
  const std::array<const char*, 7> names = {"tasks",   "compute", "local comm", "cross comm",
                                            "receive", "step",    "dp buckets"};
  for (size_t tid = 0; tid < names.size(); ++tid) {
    const auto t = static_cast<int64_t>(tid);
    events.push_back(metadata("thread_name", rank, t, {{"name", names[tid]}}));
    events.push_back(metadata("thread_sort_index", rank, t, {{"sort_index", t}}));
  }
}

// The times of one rank, in microseconds from its host's origin.
struct RankClock {
  int64_t origin_ns = 0;
  double us(int64_t ns) const { return round_time_us(static_cast<double>(ns - origin_ns) / 1e3); }
};

OrderedJson slice(std::string_view name, std::string_view category, int64_t pid, int64_t tid,
                  const RankClock& clock, int64_t start_ns, int64_t end_ns, OrderedJson args) {
  const double ts = clock.us(start_ns);
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"ts", ts},
          {"dur", std::max(0.0, clock.us(end_ns) - ts)},
          {"pid", pid},
          {"tid", tid},
          {"args", std::move(args)}};
}

std::string_view strand_of(std::string_view op) {
  if (op.starts_with("fwd.")) return "fwd";
  if (op.starts_with("bwd.")) return "bwd";
  return "extra";
}

int64_t thread_of(const Instruction& in, ExecutionMode mode) {
  if (in.kind == InstructionKind::kRecv && mode == ExecutionMode::kCoExecuted) return kReceiveTid;
  if (mode == ExecutionMode::kSequential) return 1;  // the calling thread runs everything
  return 1 + static_cast<int64_t>(in.stream);
}

OrderedJson op_args(const PlanStage& stage, const Instruction& in, int64_t step, size_t index) {
  OrderedJson args = {{"step", step}, {"instruction", static_cast<int64_t>(index)}};
  if (in.task >= 0 && in.task < static_cast<int64_t>(stage.tasks.size())) {
    args["task"] = stage.tasks[static_cast<size_t>(in.task)].label;
  }
  args["micro_batch"] = in.micro_batch;
  if (in.layer >= 0) args["layer"] = in.layer;
  if (in.block >= 0) args["block"] = in.block;
  if (in.group) args["group"] = parallel_dim_name(*in.group);
  args["kind"] = instruction_kind_name(in.kind);
  return args;
}

void add_step_events(const PlanStage& stage, const RankProgram& program, const StepRecord& s,
                     int64_t rank, const RankClock& clock, OrderedJson& events) {
  DHELIX_CHECK(s.ops.size() == program.instructions.size());
  std::map<int64_t, std::pair<int64_t, int64_t>> task_span;  // task -> (first start, last end)
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Instruction& in = program.instructions[i];
    const OpTiming& t = s.ops[i];
    const int64_t tid = thread_of(in, program.mode);
    if (t.ready_ns > 0 && t.ready_ns < t.start_ns && in.kind != InstructionKind::kRecv) {
      events.push_back(slice("wait", "wait", rank, tid, clock, t.ready_ns, t.start_ns,
                             {{"step", s.step}, {"instruction", static_cast<int64_t>(i)}}));
    }
    events.push_back(slice(in.op, strand_of(in.op), rank, tid, clock, t.start_ns, t.end_ns,
                           op_args(stage, in, s.step, i)));
    auto [it, fresh] = task_span.try_emplace(in.task, t.start_ns, t.end_ns);
    if (!fresh) {
      it->second.first = std::min(it->second.first, t.start_ns);
      it->second.second = std::max(it->second.second, t.end_ns);
    }
  }
  for (const auto& [task, span] : task_span) {
    if (task < 0 || task >= static_cast<int64_t>(stage.tasks.size())) continue;
    const PlanTask& pt = stage.tasks[static_cast<size_t>(task)];
    events.push_back(slice(pt.label, "task", rank, kTasksTid, clock, span.first, span.second,
                           {{"step", s.step}, {"task", task}, {"kind", task_kind_name(pt.kind)}}));
  }
  const OrderedJson step_args = {{"step", s.step}};
  events.push_back(slice("iteration", "step", rank, kStepTid, clock, s.iteration_start_ns,
                         s.iteration_end_ns, step_args));
  if (s.sync_end_ns > 0) {
    events.push_back(slice("dp_reduction", "step", rank, kStepTid, clock, s.update_start_ns,
                           s.sync_end_ns, step_args));
    events.push_back(slice("optimizer", "step", rank, kStepTid, clock, s.sync_end_ns,
                           s.update_end_ns, step_args));
  } else {
    events.push_back(slice("update", "step", rank, kStepTid, clock, s.update_start_ns,
                           s.update_end_ns, step_args));
  }
  for (const BucketTiming& b : s.buckets) {
    if (b.end_ns == 0) continue;  // never ran (a failed step)
    events.push_back(slice(b.gather ? "dp_param_gather" : "dp_bucket", "dp_bucket", rank,
                           kBucketTid, clock, b.start_ns, b.end_ns,
                           {{"step", s.step}, {"bucket", b.bucket}}));
  }
}

// The "memory" counter track of one rank over its traced steps (memory_timeline.h).
void add_memory_events(const RankMemory& memory, const RankProgram& program,
                       const std::vector<int64_t>& map, const std::vector<StepRecord>& steps,
                       int64_t rank, const RankClock& clock, OrderedJson& events) {
  if (program.mode == ExecutionMode::kSequential && map.empty()) return;  // not the same program
  for (const StepRecord& s : steps) {
    for (const MemorySample& sample :
         activation_timeline(memory.report, s.ops, map, s.iteration_start_ns, s.iteration_end_ns)) {
      events.push_back({{"name", "memory"},
                        {"ph", "C"},
                        {"ts", clock.us(sample.time_ns)},
                        {"pid", rank},
                        {"args", {{"activation_bytes", sample.bytes}}}});
    }
  }
}

std::string trace_text(const OrderedJson& events, const OrderedJson& other) {
  std::string out = "{\"traceEvents\": [\n";
  for (size_t i = 0; i < events.size(); ++i) {
    out += events[i].dump();
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  out += "],\n\"displayTimeUnit\": \"ms\",\n";
  out += "\"otherData\": " + other.dump() + "}\n";
  return out;
}

}  // namespace

RunTrace::RunTrace(ExecutionMode mode, int64_t rank) : mode_(mode), rank_(rank) {
  check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  origin_ns_ = now_ns();
}

StepRecord& RunTrace::add_step(int64_t step) {
  steps_.emplace_back();
  steps_.back().step = step;
  return steps_.back();
}

void RunTrace::write(const std::string& path, const Plan& plan, const JobSpec& job) const {
  const std::vector<RankRecords> records = gather_at_root(rank_, origin_ns_, steps_);
  if (rank_ != 0) return;
  // One clock per host: the origin of the lowest rank on each host.
  std::map<std::string, int64_t> host_origin;
  for (const RankRecords& r : records) host_origin.try_emplace(r.host, r.origin_ns);
  OrderedJson events = OrderedJson::array();
  std::vector<RankProgram> programs;
  for (size_t r = 0; r < records.size(); ++r) {
    programs.push_back(lower_rank_program(plan, job, static_cast<int64_t>(r), mode_));
    add_rank_metadata(static_cast<int64_t>(r), programs.back().stage, events);
  }
  for (size_t r = 0; r < records.size(); ++r) {
    const RankProgram& program = programs[r];
    const PlanStage* stage = nullptr;
    for (const PlanStage& s : plan.stages) {
      if (s.stage == program.stage) stage = &s;
    }
    DHELIX_CHECK(stage != nullptr);
    const RankClock clock{host_origin.at(records[r].host)};
    for (const StepRecord& s : records[r].steps) {
      add_step_events(*stage, program, s, static_cast<int64_t>(r), clock, events);
    }
    if (r < memory_.size()) {
      // Buffer lifetimes index the co-executed program; a sequential trace's are mapped.
      const std::vector<int64_t> map =
          mode_ == ExecutionMode::kSequential
              ? instruction_map(lower_rank_program(plan, job, static_cast<int64_t>(r),
                                                   ExecutionMode::kCoExecuted),
                                program)
              : std::vector<int64_t>{};
      add_memory_events(memory_[r], program, map, records[r].steps, static_cast<int64_t>(r), clock,
                        events);
    }
  }
  OrderedJson steps = OrderedJson::array();
  for (const StepRecord& s : steps_) steps.push_back(s.step);
  OrderedJson other = {
      {"job", plan.job.name},
      {"schema_version", plan.schema_version},
      {"num_micro_batches", plan.num_micro_batches},
      // What the plan's ops follow from (lib/plan_identity.h): dhelix-diff --measured and
      // dhelix-profile --from-trace refuse the trace for another plan or job.
      {"plan_identity", plan_identity_json(plan_identity(job))},
      {"measured", true},
      {"schedule", execution_mode_name(mode_)},
      {"ranks", static_cast<int64_t>(records.size())},
      {"steps", std::move(steps)},
      {"hosts", static_cast<int64_t>(host_origin.size())},
      {"clock",
       "steady_clock, one per host, origin at a barrier before the first step (the lowest "
       "rank's reading on each host)"}};
  if (!memory_.empty()) {
    OrderedJson memory = OrderedJson::array();
    for (const RankMemory& m : memory_) memory.push_back(memory_record_json(m));
    other["memory"] = std::move(memory);
  }
  if (!link_emulation_.is_null()) other["link_emulation"] = link_emulation_;
  write_file_atomically(path, trace_text(events, other));
}

}  // namespace dhelix::rt
