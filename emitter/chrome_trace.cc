#include "emitter/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "emitter/task_expansion.h"
#include "lib/atomic_file.h"
#include "lib/plan/plan_writer.h"

namespace dhelix {
namespace {

constexpr int64_t kTasksTid = 0;
// A stage's pipeline sends and its DP reduction have rows of their own: they run beside the
// layers' own communication on the same links.
constexpr int64_t kSendsTid = 4;
constexpr int64_t kDpTid = 5;

// Thread ids: the task row, then the streams in their enum order.
int64_t stream_tid(StreamClass stream) { return 1 + static_cast<int64_t>(stream); }

bool has_sends(const PlanStage& stage) { return stage.phases && stage.phases->p2p_us > 0; }

bool has_dp(const PlanStage& stage) {
  if (!stage.phases) return false;
  const PlanStagePhases& p = *stage.phases;
  return p.dp_reduce_hidden_us + p.dp_reduce_exposed_us + p.dp_gather_hidden_us +
             p.dp_gather_exposed_us >
         0;
}

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
  const auto thread = [&](int64_t tid, const std::string& name) {
    events.push_back(metadata("thread_name", pid, tid, {{"name", name}}));
    events.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  };
  for (StreamClass stream : kStreamClassNames.values())
    thread(stream_tid(stream), stream_title(stream));
  if (has_sends(stage)) {
    thread(kSendsTid, fmt::format("{}: pipeline sends", stream_title(stage.phases->p2p_stream)));
  }
  if (has_dp(stage)) {
    thread(kDpTid, fmt::format("{}: DP reduction", stream_title(stage.phases->dp_stream)));
  }
}

OrderedJson slice(const std::string& name, const char* category, int64_t pid, int64_t tid,
                  double start_us, double end_us, const char* colour, OrderedJson args) {
  const double ts = round_time_us(start_us);
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"ts", ts},
          {"dur", round_time_us(std::max(0.0, round_time_us(end_us) - ts))},
          {"pid", pid},
          {"tid", tid},
          {"cname", colour},
          {"args", std::move(args)}};
}

OrderedJson task_args(const PlanTask& task) {
  OrderedJson args = {{"task", task.index}, {"kind", task_kind_name(task.kind)}};
  const auto part = [](const PlanTaskPart& p) {
    OrderedJson out{
        {"micro_batch", p.micro_batch},
        {"chunk", chunk_side_name(p.chunk)},
        {"layers", fmt::format("{}-{}", p.layers.first, p.layers.first + p.layers.count - 1)}};
    if (p.model_chunk) out["model_chunk"] = *p.model_chunk;  // interleaved stages only
    return out;
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
  if (op.block >= 0) {
    args["block"] = op.block;
    args["blocks"] = op.blocks;
  }
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

// ----- beside and after the tasks: DP reduction, optimizer step, pipeline sends ----------

struct TailPhase {
  const char* name;
  double time_us;
  const char* colour;
};

// After the stage's last task, on the task row (what lengthens the iteration): the exposed
// DP reduction, the optimizer step (also on the compute row), the exposed parameter gather.
// On the DP row the whole reduction, its hidden part under the last backwards, and the
// gather's hidden part under the first forwards.
void add_phase_events(const PlanStage& stage, const TraceOptions& options, OrderedJson& events) {
  if (!stage.phases || stage.tasks.empty() || options.micro_batch_limit >= 0) return;
  const PlanStagePhases& p = *stage.phases;
  const double first_us = stage.tasks.front().start_us;
  const double last_us = stage.tasks.back().end_us;
  const int64_t pid = stage.stage;
  double t = last_us;
  for (const TailPhase& phase :
       {TailPhase{"dp gradient reduction (exposed)", p.dp_reduce_exposed_us, "bad"},
        TailPhase{"optimizer step", p.optimizer_us, "olive"},
        TailPhase{"dp parameter gather (exposed)", p.dp_gather_exposed_us, "bad"}}) {
    if (phase.time_us <= 0) continue;
    OrderedJson args = {{"phase", phase.name}, {"time_us", round_time_us(phase.time_us)}};
    events.push_back(slice(phase.name, "iteration_end", pid, kTasksTid, t, t + phase.time_us,
                           phase.colour, args));
    if (std::string(phase.name) == "optimizer step") {
      events.push_back(slice(phase.name, "iteration_end", pid, stream_tid(StreamClass::kCompute), t,
                             t + phase.time_us, "olive", args));
    }
    t += phase.time_us;
  }
  if (!has_dp(stage)) return;
  const double reduce_start_us = last_us - p.dp_reduce_hidden_us;
  if (p.dp_gather_hidden_us > 0) {
    events.push_back(
        slice("dp parameter gather (hidden)", "dp", pid, kDpTid, first_us,
              std::min(first_us + p.dp_gather_hidden_us, reduce_start_us), "good",
              {{"hidden_us", round_time_us(p.dp_gather_hidden_us)},
               {"note", "the parameters of the step before, under the first forwards"}}));
  }
  const double reduce_us = p.dp_reduce_hidden_us + p.dp_reduce_exposed_us;
  if (reduce_us > 0) {
    events.push_back(slice("dp gradient reduction", "dp", pid, kDpTid, reduce_start_us,
                           last_us + p.dp_reduce_exposed_us, "good",
                           {{"hidden_us", round_time_us(p.dp_reduce_hidden_us)},
                            {"exposed_us", round_time_us(p.dp_reduce_exposed_us)}}));
  }
  if (p.dp_gather_exposed_us > 0) {
    const double at = last_us + p.dp_reduce_exposed_us + p.optimizer_us;
    events.push_back(slice("dp parameter gather", "dp", pid, kDpTid, at,
                           at + p.dp_gather_exposed_us, "bad",
                           {{"exposed_us", round_time_us(p.dp_gather_exposed_us)}}));
  }
}

const PlanTask* find_task(const Plan& plan, const PlanTaskRef& ref);

// One slice per task whose results another stage waits for, from its end for the sender's
// p2p time (the pipeline simulator's model), naming the receivers; a send that would start
// before the previous one ended joins it, so that the row never overlaps itself.
void add_sends(const Plan& plan, const TraceOptions& options, OrderedJson& events) {
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> receivers;
  for (const PlanStage& stage : plan.stages) {
    for (const PlanTask& task : stage.tasks) {
      if (!task_kept(task, options)) continue;
      for (const PlanTaskRef& ref : task.waits_for) {
        const PlanTask* producer = find_task(plan, ref);
        if (producer == nullptr || !task_kept(*producer, options)) continue;
        receivers[{ref.stage, ref.task}].push_back(
            fmt::format("stage {} {}", stage.stage, task.label));
      }
    }
  }
  std::map<int64_t, std::vector<OrderedJson>> rows;
  for (const auto& [ref, to] : receivers) {
    const PlanStage& stage = plan.stages[static_cast<size_t>(ref.first)];
    if (!has_sends(stage)) continue;
    const PlanTask& task = stage.tasks[static_cast<size_t>(ref.second)];
    std::vector<OrderedJson>& row = rows[stage.stage];
    const double start = round_time_us(task.end_us);
    const double end = round_time_us(task.end_us + stage.phases->p2p_us);
    if (!row.empty()) {
      OrderedJson& last = row.back();
      const double last_end = last["ts"].get<double>() + last["dur"].get<double>();
      if (start < last_end) {
        last["dur"] = round_time_us(std::max(last_end, end) - last["ts"].get<double>());
        for (const std::string& r : to) last["args"]["to"].push_back(r);
        continue;
      }
    }
    row.push_back(slice("p2p send", "p2p", stage.stage, kSendsTid, task.end_us,
                        task.end_us + stage.phases->p2p_us, "generic_work",
                        {{"task", task.label}, {"to", to}}));
  }
  for (auto& [stage, row] : rows) {
    for (OrderedJson& e : row) events.push_back(std::move(e));
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
    schemes[std::string(pipeline_scheme_name(s.scheme)) + " iteration_us"] =
        round_time_us(s.iteration_us);
  }
  data["schemes"] = std::move(schemes);
  if (const PlanScheme* best = plan.best_baseline()) {
    // the fastest other scheme that fits in memory
    data["best_baseline"] = pipeline_scheme_name(best->scheme);
  }
  data["note"] =
      "ops of forward-only and backward-only tasks (args.approximate) are laid out from solo "
      "times; after each stage's last task come its exposed DP reduction, optimizer step and "
      "exposed parameter gather, ending at the dhelix iteration time on the slowest stage; "
      "baselines have no timeline in a plan (dhelix-plan --svg draws them)";
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  if (dhelix != nullptr) data["iteration_us"] = round_time_us(dhelix->iteration_us);
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
  for (const PlanStage& stage : plan.stages) add_phase_events(stage, options, events);
  add_sends(plan, options, events);
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
