#include "profiler/trace_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/placement.h"
#include "lib/plan_identity.h"
#include "profiler/model_backend.h"
#include "profiler/sampling.h"

namespace dhelix {
namespace {

// Op id -> op, for every op a rank of `job` runs (layer DAGs and stage extras of each stage).
std::unordered_map<std::string, Op> ops_by_id(const JobSpec& job) {
  std::unordered_map<std::string, Op> ops;
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  for (int64_t stage = 0; stage < job.parallel.pp; ++stage) {
    const int64_t rank = placement.rank_of({.pp = stage});
    for (const LayerDags& dags :
         {build_layer_dags(job, rank), build_stage_extras(job, rank, true, true)}) {
      for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
        for (int64_t i = 0; i < dag->size(); ++i) ops.try_emplace(dag->op(i).id, dag->op(i));
      }
    }
  }
  return ops;
}

// One op slice of a trace.
struct Slice {
  std::string op;
  int64_t tid = 0;
  double start = 0, end = 0;
};

// (pid, step, task, block) -> slices of one SI block.
using BlockKey = std::tuple<int64_t, int64_t, std::string, int64_t>;

// Summary of one op's measured durations, as the cpu backend summarizes its samples.
TimeStats stats_of(const std::vector<double>& v) { return sampling::summarize(v).quantized(); }

struct Samples {
  std::map<std::string, std::vector<double>> solo;  // signature -> durations
  // (signature a, signature b) with a <= b -> (finish a, finish b) instances
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<double, double>>> pairs;
};

std::string checked_schedule(const NamedTrace& t, const JobSpec& job, const PlanIdentity& identity,
                             std::vector<std::string>* warnings) {
  const Json other = t.trace.value("otherData", Json::object());
  if (!other.value("measured", false)) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: /otherData/measured: not true; --from-trace reads timelines "
                            "of dhelix-run --trace",
                            t.file));
  }
  if (other.value("job", "") != job.name) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: /otherData/job: \"{}\", but the job is \"{}\"", t.file,
                            other.value("job", ""), job.name));
  }
  // The same name is not the same job: a trace of another sequence length would record
  // its times under this job's signatures (lib/plan_identity.h).
  const std::optional<std::string> warning =
      check_trace_identity(other, identity, t.file, fmt::format("the job {}", job.source_file));
  if (warning && warnings != nullptr) warnings->push_back(*warning);
  const std::string schedule = other.value("schedule", "");
  if (schedule != "sequential" && schedule != "co-executed") {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: /otherData/schedule: \"{}\" is not sequential or co-executed",
                            t.file, schedule));
  }
  return schedule;
}

void add_samples(const NamedTrace& t, const std::string& schedule,
                 const std::unordered_map<std::string, Op>& ops, Samples& samples) {
  const auto events = t.trace.find("traceEvents");
  if (events == t.trace.end() || !events->is_array()) {
    throw Error(ErrorCode::kInvalidInput, fmt::format("{}: /traceEvents: missing", t.file));
  }
  std::map<BlockKey, std::vector<Slice>> blocks;
  for (const Json& e : *events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat != "fwd" && cat != "bwd" && cat != "extra") continue;
    const std::string name = e.value("name", "");
    const auto op = ops.find(name);
    if (op == ops.end()) continue;  // pipeline transfers: not in a profile
    const Json args = e.value("args", Json::object());
    const double start = e.value("ts", 0.0), end = start + e.value("dur", 0.0);
    if (schedule == "sequential") {
      samples.solo[op->second.signature()].push_back(end - start);
      continue;
    }
    const int64_t block = args.value("block", int64_t{-1});
    if (block < 0) continue;
    blocks[{e.value("pid", int64_t{0}), args.value("step", int64_t{0}),
            args.value("task", std::string()), block}]
        .push_back({name, e.value("tid", int64_t{0}), start, end});
  }
  for (const auto& [key, slices] : blocks) {
    std::map<int64_t, const Slice*> first;  // per thread, the earliest op
    for (const Slice& s : slices) {
      auto [it, fresh] = first.try_emplace(s.tid, &s);
      if (!fresh && s.start < it->second->start) it->second = &s;
    }
    for (auto a = first.begin(); a != first.end(); ++a) {
      for (auto b = std::next(a); b != first.end(); ++b) {
        const Slice* x = a->second;
        const Slice* y = b->second;
        std::string sx = ops.at(x->op).signature(), sy = ops.at(y->op).signature();
        const double t0 = std::min(x->start, y->start);
        double fx = x->end - t0, fy = y->end - t0;
        if (sy < sx) {
          std::swap(sx, sy);
          std::swap(fx, fy);
        }
        samples.pairs[{sx, sy}].emplace_back(fx, fy);
      }
    }
  }
}

}  // namespace

Profile profile_from_traces(const JobSpec& job, const std::vector<NamedTrace>& traces,
                            const Profile* base, OrderedJson meta,
                            std::vector<std::string>* warnings) {
  const std::unordered_map<std::string, Op> ops = ops_by_id(job);
  const PlanIdentity identity = plan_identity(job);
  Samples samples;
  for (const NamedTrace& t : traces) {
    add_samples(t, checked_schedule(t, job, identity, warnings), ops, samples);
  }
  const ProfileSpace space = collect_profile_space(job);
  Profile profile;
  profile.backend = ProfileBackend::kCpu;
  profile.cluster = base != nullptr ? base->cluster : OrderedJson::object();
  profile.model_name = job.model.name;
  profile.parallel = base != nullptr ? base->parallel : OrderedJson::object();
  std::vector<std::string> missing;
  int64_t ops_from_trace = 0, pairs_from_trace = 0;
  std::vector<double> solo_median;
  for (const Op& op : space.ops) {
    const std::string sig = op.signature();
    const auto it = samples.solo.find(sig);
    if (it != samples.solo.end()) {
      profile.add_op(
          profiled_op(op, stats_of(it->second), static_cast<int64_t>(it->second.size())));
      ++ops_from_trace;
    } else if (const ProfiledOp* known = base != nullptr ? base->find_op(sig) : nullptr) {
      profile.add_op(*known);
    } else {
      missing.push_back("op " + sig);
      profile.add_op(profiled_op(op, TimeStats::exactly(0), 1));  // dropped with the error
    }
    solo_median.push_back(profile.ops().back().time_us.median_us);
  }
  for (const auto& [i, j] : space.pairs) {
    const std::string a = space.ops[static_cast<size_t>(i)].signature();
    const std::string b = space.ops[static_cast<size_t>(j)].signature();
    const auto key = a <= b ? std::make_pair(a, b) : std::make_pair(b, a);
    const auto it = samples.pairs.find(key);
    std::vector<sampling::PairSample> runs;
    if (it != samples.pairs.end()) {
      for (const auto& [x, y] : it->second) runs.push_back({x, y});
      ++pairs_from_trace;
    } else if (const auto known =
                   base != nullptr ? base->find_pair(key.first, key.second) : std::nullopt) {
      runs.push_back({known->finish_a_us, known->finish_b_us});  // refitted to the new solos
    }
    if (!runs.empty()) {
      // The cpu backend's fit: finish times raised to the solo medians, OEF >= -1, and the
      // OEF recomputed from this profile's solo medians (lib/profile.h checks it).
      profile.add_pair(sampling::pair_from_samples(
          key.first, key.second, profile.find_op(key.first)->time_us.median_us,
          profile.find_op(key.second)->time_us.median_us, runs, nullptr));
    } else {
      missing.push_back("pair " + a + " x " + b);
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t k = 0; k < std::min<size_t>(missing.size(), 5); ++k) list += "\n  " + missing[k];
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--from-trace: the traces give no time for {} of the {} ops and "
                            "pairs the profile of {} needs; give --base PROFILE (e.g. from "
                            "dhelix-profile --backend cpu) for them. Missing:{}{}",
                            missing.size(), space.ops.size() + space.pairs.size(), job.name, list,
                            missing.size() > 5 ? "\n  ..." : ""));
  }
  meta["from_trace"] = {
      {"traces", static_cast<int64_t>(traces.size())},
      {"ops", ops_from_trace},
      {"pairs", pairs_from_trace},
      {"ops_from_base", static_cast<int64_t>(space.ops.size()) - ops_from_trace},
      {"pairs_from_base", static_cast<int64_t>(space.pairs.size()) - pairs_from_trace}};
  profile.meta = std::move(meta);
  return profile;
}

}  // namespace dhelix
