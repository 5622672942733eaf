#include "emitter/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "emitter/task_expansion.h"
#include "lib/atomic_file.h"
#include "lib/plan/plan_writer.h"

namespace dhelix {
namespace {

constexpr int64_t kTasksTid = 0;

// Thread ids: the task row, then the streams in their enum order.
int64_t stream_tid(StreamClass stream) { return 1 + static_cast<int64_t>(stream); }

const char* strand_colour(const std::optional<Pass>& strand) {
  if (!strand) return "grey";
  return *strand == Pass::kForward ? "thread_state_running" : "thread_state_iowait";
}

const char* task_colour(TaskKind kind) {
  switch (kind) {
    case TaskKind::kForward:
      return "thread_state_running";
    case TaskKind::kBackward:
      return "thread_state_iowait";
    case TaskKind::kHeadLoss:
      return "yellow";
    case TaskKind::kSiBlock:
      break;
  }
  return "rail_response";
}

bool task_kept(const PlanTask& task, const TraceOptions& options) {
  if (options.micro_batch_limit < 0) return true;
  const auto below = [&](int64_t mb) { return mb < options.micro_batch_limit; };
  if (task.forward && !below(task.forward->micro_batch)) return false;
  if (task.backward && !below(task.backward->micro_batch)) return false;
  return task.kind != TaskKind::kHeadLoss || below(task.head_loss_micro_batch);
}

OrderedJson metadata(const char* name, int64_t pid, int64_t tid, OrderedJson args) {
  OrderedJson e = {{"name", name}, {"ph", "M"}, {"pid", pid}};
  if (tid >= 0) e["tid"] = tid;
  e["args"] = std::move(args);
  return e;
}

void add_stage_metadata(const PlanStage& stage, OrderedJson& events) {
  const int64_t pid = stage.stage;
  events.push_back(
      metadata("process_name", pid, -1, {{"name", fmt::format("stage {}", stage.stage)}}));
  events.push_back(metadata("process_sort_index", pid, -1, {{"sort_index", pid}}));
  events.push_back(metadata("thread_name", pid, kTasksTid, {{"name", "tasks"}}));
  events.push_back(metadata("thread_sort_index", pid, kTasksTid, {{"sort_index", kTasksTid}}));
  for (StreamClass stream : kStreamClassNames.values()) {
    const int64_t tid = stream_tid(stream);
    events.push_back(metadata("thread_name", pid, tid, {{"name", stream_title(stream)}}));
    events.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  }
}

OrderedJson slice(const std::string& name, const char* category, int64_t pid, int64_t tid,
                  double start_us, double end_us, const char* colour, OrderedJson args) {
  const double ts = round_time_us(start_us);
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"ts", ts},
          {"dur", std::max(0.0, round_time_us(end_us) - ts)},
          {"pid", pid},
          {"tid", tid},
          {"cname", colour},
          {"args", std::move(args)}};
}

OrderedJson task_args(const PlanTask& task) {
  OrderedJson args = {{"task", task.index}, {"kind", task_kind_name(task.kind)}};
  const auto part = [](const PlanTaskPart& p) {
    return OrderedJson{
        {"micro_batch", p.micro_batch},
        {"chunk", chunk_side_name(p.chunk)},
        {"layers", fmt::format("{}-{}", p.layers.first, p.layers.first + p.layers.count - 1)}};
  };
  if (task.forward) args["forward"] = part(*task.forward);
  if (task.backward) args["backward"] = part(*task.backward);
  if (task.kind == TaskKind::kHeadLoss) args["micro_batch"] = task.head_loss_micro_batch;
  return args;
}

OrderedJson op_args(const PlanTask& task, const ExpandedOp& op) {
  OrderedJson args = {{"task", task.label}, {"micro_batch", op.micro_batch}};
  if (op.layer >= 0) args["layer"] = op.layer;
  if (op.strand) args["strand"] = pass_name(*op.strand);
  if (op.block >= 0) args["block"] = op.block;
  if (op.group) args["group"] = parallel_dim_name(*op.group);
  if (op.approximate) args["approximate"] = true;
  return args;
}

void add_task_events(const Plan& plan, const PlanStage& stage, const PlanTask& task,
                     const TraceOptions& options, OrderedJson& events) {
  events.push_back(slice(task.label, "task", stage.stage, kTasksTid, task.start_us, task.end_us,
                         task_colour(task.kind), task_args(task)));
  if (!options.expand_ops) return;
  for (const ExpandedOp& op : expand_task(plan, stage, task)) {
    events.push_back(slice(op.name, op.strand ? pass_name(*op.strand) : "extra", stage.stage,
                           stream_tid(op.stream), op.start_us, op.end_us, strand_colour(op.strand),
                           op_args(task, op)));
  }
}

const PlanTask* find_task(const Plan& plan, const PlanTaskRef& ref) {
  if (ref.stage < 0 || ref.stage >= static_cast<int64_t>(plan.stages.size())) return nullptr;
  const auto& tasks = plan.stages[static_cast<size_t>(ref.stage)].tasks;
  if (ref.task < 0 || ref.task >= static_cast<int64_t>(tasks.size())) return nullptr;
  return &tasks[static_cast<size_t>(ref.task)];
}

// Flow events bind to the task slice that encloses their timestamp; the middle of a slice is
// unambiguous where its ends touch the neighbours'.
OrderedJson flow(const char* phase, int64_t id, int64_t pid, const PlanTask& task) {
  OrderedJson e = {{"name", "p2p"},
                   {"cat", "p2p"},
                   {"ph", phase},
                   {"id", id},
                   {"ts", round_time_us(0.5 * (task.start_us + task.end_us))},
                   {"pid", pid},
                   {"tid", kTasksTid}};
  if (std::string(phase) == "f") e["bp"] = "e";
  return e;
}

void add_flows(const Plan& plan, const TraceOptions& options, OrderedJson& events) {
  int64_t next_id = 1;
  for (const PlanStage& stage : plan.stages) {
    for (const PlanTask& task : stage.tasks) {
      if (!task_kept(task, options)) continue;
      for (const PlanTaskRef& ref : task.waits_for) {
        const PlanTask* producer = find_task(plan, ref);
        if (producer == nullptr || !task_kept(*producer, options)) continue;
        events.push_back(flow("s", next_id, ref.stage, *producer));
        events.push_back(flow("f", next_id, stage.stage, task));
        ++next_id;
      }
    }
  }
}

OrderedJson other_data(const Plan& plan) {
  OrderedJson data = {{"job", plan.job.name},
                      {"schema_version", plan.schema_version},
                      {"num_micro_batches", plan.num_micro_batches}};
  OrderedJson schemes = OrderedJson::object();
  for (const PlanScheme& s : plan.schemes) {
    schemes[s.scheme + " iteration_us"] = round_time_us(s.iteration_us);
  }
  data["schemes"] = std::move(schemes);
  if (const PlanScheme* best = plan.best_baseline()) {
    data["best_baseline"] = best->scheme;  // the fastest other scheme that fits in memory
  }
  data["note"] =
      "ops of forward-only and backward-only tasks (args.approximate) are laid out from solo "
      "times; baselines have no timeline in a plan (dhelix-plan --svg draws them)";
  return data;
}

}  // namespace

OrderedJson chrome_trace(const Plan& plan, const TraceOptions& options) {
  OrderedJson events = OrderedJson::array();
  for (const PlanStage& stage : plan.stages) add_stage_metadata(stage, events);
  for (const PlanStage& stage : plan.stages) {
    for (const PlanTask& task : stage.tasks) {
      if (task_kept(task, options)) add_task_events(plan, stage, task, options, events);
    }
  }
  add_flows(plan, options, events);
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", other_data(plan)}};
}

std::string chrome_trace_text(const Plan& plan, const TraceOptions& options) {
  const OrderedJson trace = chrome_trace(plan, options);
  std::string out = "{\"traceEvents\": [\n";
  const OrderedJson& events = trace["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    out += events[i].dump();
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  out += "],\n\"displayTimeUnit\": " + trace["displayTimeUnit"].dump() + ",\n";
  out += "\"otherData\": " + trace["otherData"].dump() + "}\n";
  return out;
}

void write_trace_file(const Plan& plan, const std::string& path) {
  write_file_atomically(path, chrome_trace_text(plan, TraceOptions{}));
}

}  // namespace dhelix
