// Predicted against measured memory, per rank (measured_memory.h).
#include "emitter/measured_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/plan/plan_job.h"
#include "planner/memory_model.h"

namespace dhelix {
namespace {

// One rank's record in the trace's otherData.memory (runtime/train/memory_record.h).
struct MeasuredRecord {
  int64_t rank = 0;
  int64_t stage = 0;
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activation_arena_bytes = 0;
  int64_t activation_live_peak_bytes = 0;
  int64_t activation_counted_peak_bytes = 0;
  int64_t activation_element_bytes = 0;
  int64_t weight_bytes_per_parameter = 0;
  int64_t gradient_bytes_per_parameter = 0;
  int64_t optimizer_bytes_per_parameter = 0;
  int64_t optimizer_shards = 0;
  int64_t buffers = 0;
  int64_t expert_optimizer_bytes = 0;
  int64_t expert_optimizer_shards = 1;
};

[[noreturn]] void bad_record(const std::string& label, const std::string& what) {
  throw Error(ErrorCode::kInvalidInput, fmt::format("{}: {}", label, what));
}

// An integer field of record `index`, at least `minimum`.
int64_t field(const Json& record, size_t index, const char* key, int64_t minimum,
              const std::string& label) {
  const auto it = record.find(key);
  const std::string pointer = fmt::format("/otherData/memory/{}/{}", index, key);
  if (it == record.end() || !it->is_number_integer()) {
    bad_record(label, fmt::format("{}: missing or not an integer", pointer));
  }
  const auto value = it->get<int64_t>();
  if (value < minimum) {
    bad_record(label, fmt::format("{}: {} is below {}", pointer, value, minimum));
  }
  return value;
}

std::vector<MeasuredRecord> read_records(const Json& memory, const std::string& label) {
  if (!memory.is_array()) bad_record(label, "/otherData/memory: not an array");
  std::vector<MeasuredRecord> records;
  for (size_t i = 0; i < memory.size(); ++i) {
    const Json& m = memory[i];
    if (!m.is_object()) bad_record(label, fmt::format("/otherData/memory/{}: not an object", i));
    records.push_back(
        {field(m, i, "rank", 0, label), field(m, i, "stage", 0, label),
         field(m, i, "weight_bytes", 0, label), field(m, i, "gradient_bytes", 0, label),
         field(m, i, "optimizer_bytes", 0, label), field(m, i, "activation_arena_bytes", 0, label),
         field(m, i, "activation_live_peak_bytes", 0, label),
         field(m, i, "activation_counted_peak_bytes", 0, label),
         field(m, i, "activation_element_bytes", 1, label),
         field(m, i, "weight_bytes_per_parameter", 1, label),
         field(m, i, "gradient_bytes_per_parameter", 1, label),
         field(m, i, "optimizer_bytes_per_parameter", 1, label),
         field(m, i, "optimizer_shards", 1, label), field(m, i, "buffers", 0, label),
         field(m, i, "expert_optimizer_bytes", 0, label),
         field(m, i, "expert_optimizer_shards", 1, label)});
  }
  return records;
}

// A model-state row: the parameter counts follow from bytes, bytes per parameter, shards.
MemoryTermRow state_row(const char* term, int64_t predicted_bytes, int64_t predicted_parameters,
                        int64_t predicted_bpp, int64_t predicted_shards, int64_t measured_bytes,
                        int64_t measured_bpp, int64_t measured_shards) {
  MemoryTermRow row{.term = term,
                    .predicted_bytes = predicted_bytes,
                    .measured_bytes = measured_bytes,
                    .predicted_parameters = predicted_parameters,
                    .measured_parameters = std::nullopt,
                    .predicted_bytes_per_parameter = predicted_bpp,
                    .measured_bytes_per_parameter = measured_bpp,
                    .predicted_shards = predicted_shards,
                    .measured_shards = measured_shards};
  const int64_t held = measured_bytes * measured_shards;
  if (held % measured_bpp == 0) row.measured_parameters = held / measured_bpp;
  return row;
}

const PlanStageMemory& stage_memory_of(const PlanScheme& scheme, int64_t stage,
                                       const std::string& label, size_t index) {
  for (const PlanStageMemory& m : scheme.memory) {
    if (m.stage == stage) return m;
  }
  bad_record(label, fmt::format("/otherData/memory/{}/stage: {}, but the plan's dhelix scheme "
                                "has memory for {} stages",
                                index, stage, scheme.memory.size()));
}

}  // namespace

std::optional<double> MemoryTermRow::error_pct() const {
  if (predicted_bytes <= 0) return std::nullopt;
  return static_cast<double>(measured_bytes - predicted_bytes) /
         static_cast<double>(predicted_bytes) * 100.0;
}

bool MemoryTermRow::parameters_match() const {
  return !predicted_parameters || measured_parameters == predicted_parameters;
}

std::optional<MeasuredMemory> compare_memory(const Plan& plan, const Json& trace,
                                             const std::string& trace_label) {
  const Json other = trace.value("otherData", Json::object());
  const auto it = other.find("memory");
  if (it == other.end() || it->is_null()) return std::nullopt;
  const std::vector<MeasuredRecord> records = read_records(*it, trace_label);
  const PlanScheme* scheme = plan.find_scheme(PipelineScheme::kDHelix);
  if (scheme == nullptr || scheme->memory.empty()) {
    bad_record(trace_label,
               "the plan has no dhelix scheme memory (schemes[dhelix].memory) to "
               "compare /otherData/memory with");
  }
  const JobSpec job = job_from_plan(plan, "the plan");
  const ParallelSpec& p = job.parallel;
  const bool sharded = plan.options.distributed_optimizer;
  const int64_t dense_shards = sharded ? p.dp * p.cp : 1;
  const int64_t expert_shards =
      sharded ? std::max<int64_t>(1, p.dp * p.cp * p.tp / (p.ep * p.expert_tp_size())) : 1;
  const int64_t plan_element = dtype_bytes(job.model.dtype);
  MeasuredMemory out;
  out.scheme = "dhelix";
  for (size_t i = 0; i < records.size(); ++i) {
    const MeasuredRecord& r = records[i];
    if (r.stage >= p.pp) {
      bad_record(trace_label,
                 fmt::format("/otherData/memory/{}/stage: {}, but the plan has {} stages", i,
                             r.stage, p.pp));
    }
    const PlanStageMemory& m = stage_memory_of(*scheme, r.stage, trace_label, i);
    const StageParameters stage_params = stage_parameters(job.model, p, scheme->shape, r.stage);
    const int64_t params = stage_params.total();
    RankMemoryDiff rank{.rank = r.rank,
                        .stage = r.stage,
                        .activation_element_bytes = r.activation_element_bytes,
                        .plan_activation_element_bytes = plan_element,
                        .buffers = r.buffers,
                        .terms = {}};
    rank.terms.push_back(state_row("weights", m.weight_bytes, params, plan_element, 1,
                                   r.weight_bytes, r.weight_bytes_per_parameter, 1));
    rank.terms.push_back(state_row("gradients", m.gradient_bytes, params,
                                   kGradientBytesPerParameter, 1, r.gradient_bytes,
                                   r.gradient_bytes_per_parameter, 1));
    rank.terms.push_back(state_row("optimizer states", m.optimizer_bytes, params,
                                   kOptimizerBytesPerParameter, dense_shards, r.optimizer_bytes,
                                   r.optimizer_bytes_per_parameter, r.optimizer_shards));
    MemoryTermRow& optimizer = rank.terms.back();
    optimizer.predicted_expert_parameters = stage_params.expert;
    optimizer.predicted_expert_shards = expert_shards;
    // The experts' states are split over their own group (expert data parallel).
    const int64_t held = (r.optimizer_bytes - r.expert_optimizer_bytes) * r.optimizer_shards +
                         r.expert_optimizer_bytes * r.expert_optimizer_shards;
    optimizer.measured_parameters =
        held % r.optimizer_bytes_per_parameter == 0
            ? std::optional<int64_t>(held / r.optimizer_bytes_per_parameter)
            : std::nullopt;
    const auto activations = static_cast<int64_t>(std::llround(
        static_cast<double>(m.activation_bytes) * static_cast<double>(r.activation_element_bytes) /
        static_cast<double>(plan_element)));
    for (const auto& [name, measured] :
         {std::pair{"activations (arena)", r.activation_arena_bytes},
          std::pair{"activations (live peak)", r.activation_live_peak_bytes},
          std::pair{"activations (the plan's count)", r.activation_counted_peak_bytes}}) {
      MemoryTermRow row;
      row.term = name;
      row.predicted_bytes = activations;
      row.measured_bytes = measured;
      rank.terms.push_back(std::move(row));
    }
    for (const MemoryTermRow& row : rank.terms) {
      if (row.parameters_match()) continue;
      out.mismatches.push_back(fmt::format(
          "measured memory: rank {} (stage {}): {}: {} bytes at {} per parameter over {} "
          "shard(s) {}, but the plan's stage {} has {} parameters",
          r.rank, r.stage, row.term, row.measured_bytes, row.measured_bytes_per_parameter,
          row.measured_shards,
          row.measured_parameters ? fmt::format("hold {} parameters", *row.measured_parameters)
                                  : std::string("are no whole number of parameters"),
          r.stage, *row.predicted_parameters));
    }
    out.ranks.push_back(std::move(rank));
  }
  std::sort(out.ranks.begin(), out.ranks.end(),
            [](const RankMemoryDiff& a, const RankMemoryDiff& b) { return a.rank < b.rank; });
  return out;
}

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1 << 20); }

std::string error_text(const std::optional<double>& error) {
  return error ? fmt::format("{:+.1f} %", *error) : "-";
}

std::string count_text(const std::optional<int64_t>& n) { return n ? fmt::format("{}", *n) : "-"; }

}  // namespace

std::string measured_memory_text(const std::optional<MeasuredMemory>& memory) {
  if (!memory) {
    return "\nmemory: the trace has no memory record (/otherData/memory: a dhelix-run --trace "
           "before it measured memory)\n";
  }
  std::string out = fmt::format(
      "\nmemory per rank: the plan's {} stage memory (schemes[{}].memory) vs the run's\n"
      "  model states: parameters = bytes x shards / bytes per parameter must equal the "
      "plan's;\n"
      "    plan: weights in the model's dtype, fp32 gradients (4), fp32 master weights and "
      "Adam\n"
      "    moments (12) split over dp x cp with the distributed optimizer; run: as its "
      "backend\n"
      "    holds them (bytes/param and shards: plan / run); at equal parameters these "
      "sizes\n"
      "    explain the bytes\n"
      "  activations: the plan's peak x the run's activation element bytes / the plan's (the "
      "model's dtype)\n",
      memory->scheme, memory->scheme);
  for (const RankMemoryDiff& rank : memory->ranks) {
    out += fmt::format("\nrank {} (stage {}): activations x {}/{}\n", rank.rank, rank.stage,
                       rank.activation_element_bytes, rank.plan_activation_element_bytes);
    out += fmt::format("{:<30} {:>13} {:>13} {:>9} {:>21} {:>11} {:>7}\n", "term", "predicted MiB",
                       "measured MiB", "error", "parameters plan/run", "bytes/param", "shards");
    bool match = true;
    for (const MemoryTermRow& row : rank.terms) {
      match = match && row.parameters_match();
      const bool state = row.predicted_parameters.has_value();
      out += fmt::format(
          "{:<30} {:>13.3f} {:>13.3f} {:>9} {:>21} {:>11} {:>7}\n", row.term,
          mib(row.predicted_bytes), mib(row.measured_bytes), error_text(row.error_pct()),
          state ? fmt::format(
                      "{} {} {}", count_text(row.predicted_parameters),
                      row.parameters_match() ? "=" : "!=", count_text(row.measured_parameters))
                : "-",
          state ? fmt::format("{} / {}", row.predicted_bytes_per_parameter,
                              row.measured_bytes_per_parameter)
                : "-",
          state ? fmt::format("{} / {}", row.predicted_shards, row.measured_shards) : "-");
    }
    for (const MemoryTermRow& row : rank.terms) {
      if (row.predicted_expert_parameters == 0) continue;
      out += fmt::format(
          "{}: the plan splits the states of {} dense parameters over {} rank(s) and of {} "
          "expert parameters over {}\n",
          row.term, *row.predicted_parameters - row.predicted_expert_parameters,
          row.predicted_shards, row.predicted_expert_parameters, row.predicted_expert_shards);
    }
    out += match ? "model states: parameter counts equal the plan's; byte differences follow "
                   "from the sizes\n"
                 : "model states: PARAMETER COUNTS DIFFER from the plan's (see the failures)\n";
    if (rank.buffers == 0) {
      out +=
          "activations: the run recorded no activation arena (no buffers): its activation "
          "rows measure nothing yet\n";
    }
  }
  return out;
}

OrderedJson measured_memory_json(const std::optional<MeasuredMemory>& memory) {
  if (!memory) return nullptr;
  OrderedJson ranks = OrderedJson::array();
  for (const RankMemoryDiff& rank : memory->ranks) {
    OrderedJson terms = OrderedJson::array();
    for (const MemoryTermRow& row : rank.terms) {
      const std::optional<double> error = row.error_pct();
      const bool state = row.predicted_parameters.has_value();
      const auto optional_int = [](const std::optional<int64_t>& v) {
        return v ? OrderedJson(*v) : OrderedJson(nullptr);
      };
      terms.push_back({{"term", row.term},
                       {"predicted_bytes", row.predicted_bytes},
                       {"measured_bytes", row.measured_bytes},
                       {"error_pct", error ? OrderedJson(std::round(*error * 100) / 100) : nullptr},
                       {"predicted_parameters", optional_int(row.predicted_parameters)},
                       {"measured_parameters", optional_int(row.measured_parameters)},
                       {"parameters_match", row.parameters_match()},
                       {"predicted_bytes_per_parameter",
                        state ? OrderedJson(row.predicted_bytes_per_parameter) : nullptr},
                       {"measured_bytes_per_parameter",
                        state ? OrderedJson(row.measured_bytes_per_parameter) : nullptr},
                       {"predicted_shards", state ? OrderedJson(row.predicted_shards) : nullptr},
                       {"measured_shards", state ? OrderedJson(row.measured_shards) : nullptr},
                       {"predicted_expert_parameters",
                        state ? OrderedJson(row.predicted_expert_parameters) : nullptr},
                       {"predicted_expert_shards",
                        state ? OrderedJson(row.predicted_expert_shards) : nullptr}});
    }
    ranks.push_back({{"rank", rank.rank},
                     {"stage", rank.stage},
                     {"activation_element_bytes", rank.activation_element_bytes},
                     {"plan_activation_element_bytes", rank.plan_activation_element_bytes},
                     {"buffers", rank.buffers},
                     {"terms", std::move(terms)}});
  }
  return {
      {"scheme", memory->scheme}, {"ranks", std::move(ranks)}, {"mismatches", memory->mismatches}};
}

}  // namespace dhelix
