#include "emitter/measured_diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "emitter/task_expansion.h"
#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_writer.h"
#include "lib/plan_identity.h"

namespace dhelix {
namespace {

// One op slice of the measured trace.
struct MeasuredOp {
  std::string name;
  std::string task;
  int64_t micro_batch = -1;
  int64_t layer = -1;
  int64_t block = -1;
  double start_us = 0;
  double end_us = 0;
};

// (task label, op, layer, micro-batch): an op's place in one stage's iteration.
using OpKey = std::tuple<std::string, std::string, int64_t, int64_t>;

struct RankSteps {
  int64_t stage = -1;
  std::map<int64_t, std::vector<MeasuredOp>> ops;  // by step
  std::map<int64_t, double> iteration_us;          // by step: the program's execution
  std::map<int64_t, double> update_us;             // by step: gradient sums and optimizer
};

[[noreturn]] void bad_trace(const std::string& label, const std::string& what) {
  throw Error(ErrorCode::kInvalidInput, fmt::format("{}: {}", label, what));
}

int64_t int_arg(const Json& args, const char* key, int64_t fallback) {
  const auto it = args.find(key);
  return it != args.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

std::string string_arg(const Json& args, const char* key) {
  const auto it = args.find(key);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// "stage S rank R" -> S.
int64_t stage_of_process_name(const std::string& name, const std::string& label) {
  long long stage = -1, rank = -1;
  if (std::sscanf(name.c_str(), "stage %lld rank %lld", &stage, &rank) != 2 || stage < 0) {
    bad_trace(label, fmt::format("process name \"{}\" is not \"stage S rank R\"", name));
  }
  return stage;
}

std::map<int64_t, RankSteps> read_ranks(const Json& trace, const std::string& label) {
  const auto events = trace.find("traceEvents");
  if (events == trace.end() || !events->is_array()) {
    bad_trace(label, "/traceEvents: missing or not an array (not a Chrome trace)");
  }
  std::map<int64_t, RankSteps> ranks;
  for (const Json& e : *events) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    const int64_t pid = e.value("pid", int64_t{-1});
    if (ph == "M" && e.value("name", "") == "process_name") {
      ranks[pid].stage = stage_of_process_name(e["args"].value("name", ""), label);
      continue;
    }
    if (ph != "X") continue;
    const std::string cat = e.value("cat", "");
    const Json args = e.value("args", Json::object());
    const int64_t step = int_arg(args, "step", -1);
    const double ts = e.value("ts", 0.0);
    const double dur = e.value("dur", 0.0);
    if (cat == "step" && e.value("name", "") == "iteration") {
      ranks[pid].iteration_us[step] = dur;
    } else if (cat == "step") {  // dp_reduction and optimizer (or one "update")
      ranks[pid].update_us[step] += dur;
    } else if (cat == "fwd" || cat == "bwd" || cat == "extra") {
      ranks[pid].ops[step].push_back({e.value("name", ""), string_arg(args, "task"),
                                      int_arg(args, "micro_batch", -1), int_arg(args, "layer", -1),
                                      int_arg(args, "block", -1), ts, ts + dur});
    }
  }
  return ranks;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Per-op predictions of one stage.
struct StagePrediction {
  std::map<OpKey, double> op_us;                               // co-executed: expanded timeline
  std::map<int64_t, double> block_us;                          // co-executed: by block index
  std::map<std::string, std::pair<std::string, double>> solo;  // op id -> (kind, solo_us)
  std::map<std::string, double> extra_us;  // "embedding", "head and loss": the plan's steps
};

// The row of an op the plan has no op record of: the embedding and the head and loss are
// predicted by the plan's own steps for them (the head_loss tasks, and each task's time
// beyond its layers where it runs the embedding: emitter/task_expansion.h); pipeline
// transfers are not.
std::string extra_row(const std::string& op) {
  if (op.starts_with("p2p.")) return "pipeline transfers (no prediction)";
  if (op.find("embedding") != std::string::npos) return "embedding";
  return "head and loss";
}

StagePrediction predict_stage(const Plan& plan, const PlanStage& stage) {
  StagePrediction p;
  for (const PlanPairing& pairing : plan.pairings) {
    for (const auto* ops : {&pairing.forward_ops, &pairing.backward_ops}) {
      for (const PlanOp& op : *ops) p.solo[op.id] = {op_kind_name(op.kind), op.solo_us};
    }
  }
  for (const PlanTask& task : stage.tasks) {
    std::map<int64_t, std::pair<double, double>> spans;
    for (const ExpandedOp& op : expand_task(plan, stage, task)) {
      if (!op.strand && (op.name == "head_loss" || op.name.starts_with("embedding."))) {
        p.extra_us[extra_row(op.name)] += op.end_us - op.start_us;
        continue;
      }
      p.op_us[{task.label, op.name, op.layer, op.micro_batch}] = op.end_us - op.start_us;
      if (op.block < 0) continue;
      auto [it, fresh] = spans.try_emplace(op.block, op.start_us, op.end_us);
      if (!fresh) {
        it->second.first = std::min(it->second.first, op.start_us);
        it->second.second = std::max(it->second.second, op.end_us);
      }
    }
    for (const auto& [block, span] : spans) p.block_us[block] += span.second - span.first;
  }
  return p;
}

// The kind row an op counts in, and its predicted time (absent: not predicted).
std::pair<std::string, std::optional<double>> classify(const StagePrediction& p,
                                                       const MeasuredOp& op, bool sequential) {
  const auto solo = p.solo.find(op.name);
  if (solo == p.solo.end()) return {extra_row(op.name), std::nullopt};
  if (sequential) return {solo->second.first, solo->second.second};
  const auto it = p.op_us.find({op.task, op.name, op.layer, op.micro_batch});
  if (it == p.op_us.end()) return {op.name + " (unmatched in the plan)", std::nullopt};
  return {solo->second.first, it->second};
}

// Measured sums of one step of one rank: by kind and by block.
void measure_step(const StagePrediction& p, const std::vector<MeasuredOp>& ops, bool sequential,
                  std::map<std::string, double>& by_kind, std::map<int64_t, double>& by_block) {
  std::map<std::pair<std::string, int64_t>, std::pair<double, double>> spans;
  for (const MeasuredOp& op : ops) {
    by_kind[classify(p, op, sequential).first] += op.end_us - op.start_us;
    if (op.block < 0) continue;
    auto [it, fresh] = spans.try_emplace({op.task, op.block}, op.start_us, op.end_us);
    if (!fresh) {
      it->second.first = std::min(it->second.first, op.start_us);
      it->second.second = std::max(it->second.second, op.end_us);
    }
  }
  for (const auto& [key, span] : spans) by_block[key.second] += span.second - span.first;
}

const PlanStage& plan_stage(const Plan& plan, int64_t stage, const std::string& label) {
  for (const PlanStage& s : plan.stages) {
    if (s.stage == stage) return s;
  }
  bad_trace(label, fmt::format("a rank of stage {} was traced, but the plan has {} stages", stage,
                               plan.stages.size()));
}

void check_header(const Plan& plan, const Json& trace, const std::string& label,
                  std::vector<std::string>& warnings) {
  const Json other = trace.value("otherData", Json::object());
  if (!other.value("measured", false)) {
    bad_trace(label,
              "/otherData/measured: not true; this is not a dhelix-run --trace timeline (a "
              "dhelix-plan --trace is a prediction)");
  }
  const std::string job = other.value("job", "");
  if (job != plan.job.name) {
    bad_trace(label, fmt::format("/otherData/job: \"{}\", but the plan is for job \"{}\"", job,
                                 plan.job.name));
  }
  // The name is not the job: the trace must come from a plan of the same model, cluster
  // and parallel settings (lib/plan_identity.h), or its ops are other shapes.
  const PlanIdentity identity = plan_identity(job_from_plan(plan, "the plan"));
  if (auto warning = check_trace_identity(other, identity, label, "the plan")) {
    warnings.push_back(*warning);
  }
  const std::string schedule = other.value("schedule", "");
  if (schedule != "co-executed" && schedule != "sequential") {
    bad_trace(label, fmt::format("/otherData/schedule: \"{}\" is not co-executed or sequential",
                                 schedule));
  }
}

}  // namespace

std::optional<double> MeasuredRow::error_pct() const {
  if (!predicted_us || *predicted_us <= 0) return std::nullopt;
  return (measured_us - *predicted_us) / *predicted_us * 100.0;
}

MeasuredDiff compare_measured(const Plan& plan, const Json& trace, const std::string& trace_label,
                              std::optional<double> fail_if_off_pct) {
  MeasuredDiff diff;
  check_header(plan, trace, trace_label, diff.warnings);
  diff.trace_label = trace_label;
  diff.schedule = trace["otherData"]["schedule"].get<std::string>();
  const bool sequential = diff.schedule == "sequential";
  const std::map<int64_t, RankSteps> ranks = read_ranks(trace, trace_label);
  if (ranks.empty()) bad_trace(trace_label, "/traceEvents: no rank's timeline");
  std::set<int64_t> steps;
  for (const auto& [pid, r] : ranks) {
    for (const auto& [step, us] : r.iteration_us) steps.insert(step);
  }
  diff.ranks = static_cast<int64_t>(ranks.size());
  diff.steps = static_cast<int64_t>(steps.size());
  for (const auto& [pid, r] : ranks) {
    for (int64_t step : steps) {
      if (!r.iteration_us.count(step) || !r.ops.count(step)) {
        bad_trace(trace_label, fmt::format("rank {} has no timeline for step {}", pid, step + 1));
      }
    }
  }
  // Per stage: measured per rank (median over steps), averaged over the stage's ranks.
  std::map<std::string, std::pair<std::optional<double>, double>> kinds;  // predicted, measured
  std::map<std::pair<int64_t, int64_t>, std::pair<double, double>> blocks;
  double sequential_iteration = 0;
  std::set<int64_t> stages;
  for (const auto& [pid, r] : ranks) stages.insert(r.stage);
  for (int64_t stage : stages) {
    const StagePrediction p = predict_stage(plan, plan_stage(plan, stage, trace_label));
    std::map<std::string, double> kind_sum;
    std::map<int64_t, double> block_sum;
    int64_t stage_ranks = 0;
    const RankSteps* first = nullptr;
    for (const auto& [pid, r] : ranks) {
      if (r.stage != stage) continue;
      if (first == nullptr) first = &r;
      ++stage_ranks;
      std::map<std::string, std::vector<double>> kind_steps;
      std::map<int64_t, std::vector<double>> block_steps;
      for (const auto& [step, ops] : r.ops) {
        std::map<std::string, double> k;
        std::map<int64_t, double> b;
        measure_step(p, ops, sequential, k, b);
        for (const auto& [name, us] : k) kind_steps[name].push_back(us);
        for (const auto& [block, us] : b) block_steps[block].push_back(us);
      }
      for (const auto& [name, v] : kind_steps) kind_sum[name] += median(v);
      for (const auto& [block, v] : block_steps) block_sum[block] += median(v);
    }
    // Predictions of the instructions one rank ran in one step (every step runs the same).
    std::map<std::string, std::optional<double>> kind_predicted;
    double solo_total = 0;
    for (const MeasuredOp& op : first->ops.begin()->second) {
      const auto [kind, us] = classify(p, op, sequential);
      auto& slot = kind_predicted[kind];
      if (us) slot = slot.value_or(0) + *us;
      if (us && sequential) solo_total += *us;
    }
    for (const auto& [row, us] : p.extra_us) {
      if (!kind_predicted.contains(row)) continue;  // the rank ran no such step
      kind_predicted[row] = us;
      if (sequential) solo_total += us;
    }
    sequential_iteration = std::max(sequential_iteration, solo_total);
    for (const auto& [name, measured] : kind_sum) {
      auto& row = kinds[name];
      if (kind_predicted[name]) row.first = row.first.value_or(0) + *kind_predicted[name];
      row.second += measured / static_cast<double>(stage_ranks);
    }
    if (!sequential) {
      for (const auto& [block, measured] : block_sum) {
        const auto it = p.block_us.find(block);
        blocks[{stage, block}] = {it != p.block_us.end() ? it->second : 0.0,
                                  measured / static_cast<double>(stage_ranks)};
      }
    }
  }
  for (const auto& [name, v] : kinds) diff.op_kinds.push_back({name, v.first, v.second});
  for (const auto& [key, v] : blocks) {
    diff.blocks.push_back(
        {fmt::format("stage {} block {}", key.first, key.second), v.first, v.second});
  }
  // The iteration: the longest rank of each step, median over steps. The plan's iteration
  // ends after the exposed gradient sums and the optimizer step: a co-executed trace's
  // counts them too; the sequential prediction (solo times of the ops) does not.
  std::vector<double> per_step;
  for (int64_t step : steps) {
    double longest = 0;
    for (const auto& [pid, r] : ranks) {
      const auto update = r.update_us.find(step);
      const double extra = !sequential && update != r.update_us.end() ? update->second : 0.0;
      longest = std::max(longest, r.iteration_us.at(step) + extra);
    }
    per_step.push_back(longest);
  }
  std::optional<double> predicted;
  if (sequential) {
    predicted = sequential_iteration;
  } else {
    for (const PlanScheme& s : plan.schemes) {
      if (s.scheme == PipelineScheme::kDHelix) predicted = s.iteration_us;
    }
  }
  diff.iteration = {"iteration", predicted, median(per_step)};
  diff.memory = compare_memory(plan, trace, trace_label);
  if (diff.memory) {
    diff.failures.insert(diff.failures.end(), diff.memory->mismatches.begin(),
                         diff.memory->mismatches.end());
  }
  if (fail_if_off_pct) {
    const std::optional<double> error = diff.iteration.error_pct();
    if (!error || std::fabs(*error) > *fail_if_off_pct) {
      diff.failures.push_back(
          error ? fmt::format("measured iteration {:.3f} ms is {:+.1f} % off the predicted "
                              "{:.3f} ms (--fail-if-off {})",
                              diff.iteration.measured_us / 1e3, *error, *predicted / 1e3,
                              *fail_if_off_pct)
                : "the plan predicts no iteration time for this schedule");
    }
  }
  return diff;
}

namespace {

std::string ms_or_dash(const std::optional<double>& us) {
  return us ? fmt::format("{:.3f}", *us / 1e3) : "-";
}

void add_rows(std::string& out, const char* title, const std::vector<MeasuredRow>& rows) {
  if (rows.empty()) return;
  out +=
      fmt::format("\n{:<40} {:>14} {:>14} {:>9}\n", title, "predicted ms", "measured ms", "error");
  for (const MeasuredRow& row : rows) {
    const std::optional<double> error = row.error_pct();
    out += fmt::format("{:<40} {:>14} {:>14.3f} {:>9}\n", row.name, ms_or_dash(row.predicted_us),
                       row.measured_us / 1e3, error ? fmt::format("{:+.1f} %", *error) : "-");
  }
}

OrderedJson row_json(const MeasuredRow& row) {
  const std::optional<double> error = row.error_pct();
  OrderedJson j = {{"name", row.name}};
  j["predicted_us"] = row.predicted_us ? OrderedJson(round_time_us(*row.predicted_us)) : nullptr;
  j["measured_us"] = round_time_us(row.measured_us);
  j["error_pct"] = error ? OrderedJson(std::round(*error * 100) / 100) : nullptr;
  return j;
}

}  // namespace

std::string measured_diff_text(const MeasuredDiff& diff) {
  std::string out =
      fmt::format("predicted ({}) vs measured ({}): {} schedule, {} ranks, median of {} steps\n",
                  diff.plan_label, diff.trace_label, diff.schedule, diff.ranks, diff.steps);
  add_rows(out, "iteration", {diff.iteration});
  add_rows(out, "op kind (per iteration, all stages)", diff.op_kinds);
  add_rows(out, "SI block (summed over a stage's tasks)", diff.blocks);
  out += measured_memory_text(diff.memory);
  return out;
}

OrderedJson measured_diff_json(const MeasuredDiff& diff) {
  OrderedJson kinds = OrderedJson::array();
  for (const MeasuredRow& row : diff.op_kinds) kinds.push_back(row_json(row));
  OrderedJson blocks = OrderedJson::array();
  for (const MeasuredRow& row : diff.blocks) blocks.push_back(row_json(row));
  return {{"plan", diff.plan_label},
          {"trace", diff.trace_label},
          {"schedule", diff.schedule},
          {"steps", diff.steps},
          {"ranks", diff.ranks},
          {"iteration", row_json(diff.iteration)},
          {"op_kinds", std::move(kinds)},
          {"blocks", std::move(blocks)},
          {"memory", measured_memory_json(diff.memory)},
          {"failures", diff.failures}};
}

}  // namespace dhelix
