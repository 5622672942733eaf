#include "planner/config_search.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/job_validation.h"
#include "planner/baseline_schedules.h"
#include "planner/chosen_split.h"
#include "planner/combined_1f1b.h"
#include "planner/memory_model.h"
#include "planner/pairing_memo.h"
#include "planner/plan_builder.h"
#include "planner/profile_co_run.h"
#include "planner/scheme_memory.h"
#include "planner/search_bounds.h"
#include "planner/virtual_pipeline.h"

namespace dhelix {
namespace {

constexpr const char* kNoMemoryReason =
    "weights, gradients and optimizer states alone exceed the usable memory";
constexpr const char* kNoActivationMemoryReason =
    "with the activations of the micro-batches in flight, no stage fits under either scheme";

// The planner's refusals of a configuration (a rule of the DAG builder or the folding that
// validate_job does not state): the configuration is invalid, the search goes on.
bool planner_refusal(const Error& e) {
  return e.code() == ErrorCode::kUnsupported || e.code() == ErrorCode::kInvalidInput;
}

// The memory options dhelix-plan plans with (plan_builder.h's default).
MemoryOptions search_memory_options() { return PlanRequest{}.memory; }

// Rules of the job (first broken one), or "" when it may be planned.
std::string first_broken_rule(const JobSpec& job) {
  const ProblemList problems = validate_job(job);
  if (problems.empty()) return "";
  const Problem& p = problems.problems().front();
  return fmt::format("{} {}", p.pointer.empty() ? std::string("job") : p.pointer.substr(1),
                     p.value.empty() ? p.rule : p.value + " " + p.rule);
}

// True when some layout could hold the static memory (no activations) on every stage.
bool static_memory_fits(const JobSpec& job) {
  const MemoryOptions options = search_memory_options();
  const int64_t usable = memory_budget(job, options).usable_bytes();
  for (PipelineShape shape : {PipelineShape::kW, PipelineShape::kOneFOneB}) {
    const std::vector<int64_t> no_activations(static_cast<size_t>(job.parallel.pp), 0);
    bool fits = true;
    for (const StageMemory& stage :
         stage_memory(job.model, job.parallel, shape, options, no_activations)) {
      fits = fits && stage.total_bytes() <= usable;
    }
    if (fits) return true;
  }
  return false;
}

// The largest stage's memory of `scheme`'s plan, known before the plan (scheme_memory.h).
int64_t planned_peak_bytes(const JobSpec& job, PipelineScheme scheme) {
  int64_t peak = 0;
  for (const StageMemory& stage : scheme_memory(job, scheme, search_memory_options())) {
    peak = std::max(peak, stage.total_bytes());
  }
  return peak;
}

// The dhelix plan's largest stage before the plan: the W's (scheme_memory.h), or less where
// Megatron interleaves and `shape` lets the planner take interleaved stages, whose two
// orders are tried with their memory (planner/dhelix_shapes.h: with nothing fitting, the plan
// takes the smallest peak).
int64_t dhelix_peak_bytes(const JobSpec& job, ShapeRequest shape) {
  int64_t peak = planned_peak_bytes(job, PipelineScheme::kDHelix);
  if (shape != ShapeRequest::kAuto && shape != ShapeRequest::kInterleaved) return peak;
  const int64_t pp = job.parallel.pp;
  const int64_t m = job.parallel.num_micro_batches();
  const int64_t v = virtual_pipeline_size(job, m, 0);
  if (v <= 1) return peak;
  const PipelineSchedule plain = make_interleaved_schedule(pp, m, v);
  int64_t interleaved = 0;
  for (const PipelineSchedule& s : {make_combined_1f1b_schedule(plain), plain}) {
    int64_t order_peak = 0;
    for (const StageMemory& stage : schedule_memory(job, s, search_memory_options())) {
      order_peak = std::max(order_peak, stage.total_bytes());
    }
    interleaved = interleaved == 0 ? order_peak : std::min(interleaved, order_peak);
  }
  return shape == ShapeRequest::kInterleaved ? interleaved : std::min(peak, interleaved);
}

SearchSchemeFigures figures_of(const PlanScheme& scheme) {
  SearchSchemeFigures f;
  f.iteration_us = scheme.iteration_us;
  f.tokens_per_second = scheme.tokens_per_second;
  f.tflops_per_gpu = scheme.tflops_per_gpu;
  f.mfu = scheme.mfu;
  f.bubble_ratio = scheme.bubble_ratio;
  for (const PlanCommTime& comm : scheme.comm) f.exposed_comm_us += comm.exposed_us;
  for (const PlanStageMemory& stage : scheme.memory) {
    f.peak_memory_bytes = std::max(f.peak_memory_bytes, stage.total_bytes);
  }
  f.fits = scheme.fits;
  f.shape = scheme.shape;
  return f;
}

// A candidate that passed the rules and the static memory test. Its profile is made again
// when it is planned (about 50 ms) rather than kept: hundreds of profiles would not fit.
struct Candidate {
  int64_t index = 0;
  JobSpec job;
  bool dhelix_fits = true;    ///< its dhelix plan will fit in memory (scheme_memory.h)
  bool megatron_fits = true;  ///< ... its Megatron-LM 1F1B plan
  /// The smaller bound among the schemes that fit: the candidates' order.
  double order_us(const SchemeBounds& b) const {
    const double inf = std::numeric_limits<double>::infinity();
    return std::min(dhelix_fits ? b.dhelix_us : inf, megatron_fits ? b.megatron_us : inf);
  }
};

// Each scheme's k-th best fitting time among the configurations planned so far.
struct Bars {
  double dhelix_us = 0;
  double megatron_us = 0;
};

// True when neither scheme of the candidate can enter its top k: its plan would not fit,
// or its bound exceeds that scheme's bar.
bool beyond_bars(const Candidate& c, const SchemeBounds& bounds, const Bars& bars) {
  return (!c.dhelix_fits || bounds.dhelix_us > bars.dhelix_us) &&
         (!c.megatron_fits || bounds.megatron_us > bars.megatron_us);
}

// Why a candidate was not planned: each scheme's bound above that scheme's top k, or its
// plan out of memory.
std::string pruned_reason(const Candidate& c, const SchemeBounds& b, int64_t top_k) {
  const auto part = [](bool fits, double bound_us, const char* scheme) {
    return fits ? fmt::format("lower bound {:.1f} ms ({})", bound_us / 1000, scheme)
                : fmt::format("no memory under {}", scheme);
  };
  return fmt::format("{} and {}: neither can enter the top {} of its scheme",
                     part(c.dhelix_fits, b.dhelix_us, "dhelix"),
                     part(c.megatron_fits, b.megatron_us, "Megatron-LM 1F1B"), top_k);
}

// Plans one candidate into its outcome (planner refusals become "invalid"). Its profile
// first sharpens dhelix's bound with the co-run slow-downs (search_bounds.h), which may
// still prune it.
void plan_candidate(const SearchRequest& request, PairingMemo& memo, const Bars& bars,
                    Candidate& candidate, ConfigOutcome& out) {
  try {
    const Profile profile = request.make_profile(candidate.job);
    out.bounds = lower_bounds(candidate.job, request.solo_time_us, &profile);
    if (request.prune && beyond_bars(candidate, out.bounds, bars)) {
      out.status = ConfigStatus::kPruned;
      out.reason = pruned_reason(candidate, out.bounds, request.top_k);
      return;
    }
    PlanRequest plan_request;
    plan_request.job = &candidate.job;
    plan_request.pairing_memo = &memo;
    plan_request.profile = &profile;
    plan_request.profile_name = "the generated model profile";
    plan_request.profile_ref = {.name = "model", .sha256 = "generated:model"};
    const ClusterSpec cluster = candidate.job.cluster;
    plan_request.unprofiled_op_time_us = [&request, cluster](const Op& op) {
      return request.unprofiled_op_time_us(cluster, op);
    };
    plan_request.allow_oom = true;
    plan_request.shape = request.shape;
    const Plan plan = build_plan(plan_request).plan;
    out.status = ConfigStatus::kPlanned;
    for (const PlanScheme& scheme : plan.schemes) {
      if (scheme.scheme == PipelineScheme::kDHelix) {
        out.dhelix = figures_of(scheme);
      } else if (scheme.scheme == PipelineScheme::kMegatron1F1B) {
        out.megatron = figures_of(scheme);
      } else {
        out.baselines.emplace_back(pipeline_scheme_name(scheme.scheme), figures_of(scheme));
      }
    }
  } catch (const Error& e) {
    if (!planner_refusal(e)) throw;
    out.status = ConfigStatus::kInvalid;
    out.reason = std::string("planner: ") + e.what();
  }
}

// Runs `work(i)` for i in [0, n) on up to `threads` threads; rethrows the first error.
void parallel_for(int64_t n, int64_t threads, const std::function<void(int64_t)>& work) {
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < std::min(threads, n); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

// The k-th best fitting time of a scheme among planned outcomes (+inf with fewer than k).
double kth_best_us(const std::vector<ConfigOutcome>& configs, int64_t k,
                   SearchSchemeFigures ConfigOutcome::*scheme) {
  std::vector<double> times;
  for (const ConfigOutcome& c : configs) {
    if (c.status == ConfigStatus::kPlanned && (c.*scheme).fits) {
      times.push_back((c.*scheme).iteration_us);
    }
  }
  if (static_cast<int64_t>(times.size()) < k) return std::numeric_limits<double>::infinity();
  std::nth_element(times.begin(), times.begin() + (k - 1), times.end());
  return times[static_cast<size_t>(k - 1)];
}

std::vector<int64_t> ranking(const std::vector<ConfigOutcome>& configs, int64_t k,
                             SearchSchemeFigures ConfigOutcome::*scheme) {
  std::vector<int64_t> order;
  for (const ConfigOutcome& c : configs) {
    if (c.status == ConfigStatus::kPlanned && (c.*scheme).fits) order.push_back(c.index);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return (configs[a].*scheme).iteration_us < (configs[b].*scheme).iteration_us;
  });
  if (static_cast<int64_t>(order.size()) > k) order.resize(static_cast<size_t>(k));
  return order;
}

void check_request(const SearchRequest& r) {
  if (r.gpus < 1) {
    throw Error(ErrorCode::kInvalidInput, fmt::format("--gpus: {} must be at least 1", r.gpus));
  }
  if (r.threads < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--threads: {} must be at least 1", r.threads));
  }
  if (r.batch < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("search batch {} must be at least 1", r.batch));
  }
  if (r.top_k < 1) {
    throw Error(ErrorCode::kInvalidInput, fmt::format("--top: {} must be at least 1", r.top_k));
  }
  DHELIX_CHECK(r.make_profile && r.unprofiled_op_time_us && r.solo_time_us);
  // A cluster of fixed size holds at most its GPUs: every configuration of more would be
  // refused by the job's rules, and the report would only list rejections.
  const ClusterSpec& cluster = r.base.cluster;
  if (cluster.num_nodes > 0 && cluster.gpus_per_node > 0 &&
      r.gpus > cluster.num_nodes * cluster.gpus_per_node) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("--gpus: {} is more GPUs than cluster {} has ({} node{} x {} GPUs "
                    "= {})",
                    r.gpus, cluster.name, cluster.num_nodes, cluster.num_nodes == 1 ? "" : "s",
                    cluster.gpus_per_node, cluster.num_nodes * cluster.gpus_per_node));
  }
}

// Rules and static memory for every configuration; the survivors get a profile and a bound.
std::vector<Candidate> screen(const SearchRequest& request, std::vector<ConfigOutcome>& configs) {
  std::vector<Candidate> candidates(configs.size());
  std::vector<char> kept(configs.size(), 0);
  parallel_for(static_cast<int64_t>(configs.size()), request.threads, [&](int64_t i) {
    ConfigOutcome& out = configs[static_cast<size_t>(i)];
    JobSpec job = configuration_job(request.base, out.parallel);
    out.reason = first_broken_rule(job);
    if (!out.reason.empty()) {
      out.status = ConfigStatus::kInvalid;
      return;
    }
    if (planner_chooses_split(job.model.num_layers, job.parallel)) {
      try {  // the split dhelix-plan would choose (its profiles hold these solo times)
        const ClusterSpec& cluster = job.cluster;
        const auto solo = [&request, &cluster](const Op& op) {
          return request.solo_time_us(cluster, op);
        };
        job = configuration_job(request.base, with_planned_split(job, solo).parallel);
      } catch (const Error& e) {
        if (!planner_refusal(e)) throw;
        out.status = ConfigStatus::kInvalid;
        out.reason = std::string("planner: ") + e.what();
        return;
      }
      out.parallel = job.parallel;
      out.label = configuration_label(job.parallel, job.model.is_moe());
    }
    if (!static_memory_fits(job)) {
      out.status = ConfigStatus::kNoMemory;
      out.reason = kNoMemoryReason;
      return;
    }
    const int64_t usable = memory_budget(job, search_memory_options()).usable_bytes();
    out.dhelix.peak_memory_bytes = dhelix_peak_bytes(job, request.shape);
    out.megatron.peak_memory_bytes = planned_peak_bytes(job, PipelineScheme::kMegatron1F1B);
    Candidate& c = candidates[static_cast<size_t>(i)];
    c.dhelix_fits = out.dhelix.peak_memory_bytes <= usable;
    c.megatron_fits = out.megatron.peak_memory_bytes <= usable;
    if (!c.dhelix_fits && !c.megatron_fits) {
      out.status = ConfigStatus::kNoMemory;
      out.reason = kNoActivationMemoryReason;
      return;
    }
    try {
      out.bounds =
          lower_bounds(job, request.solo_time_us);  // builds the layer DAGs, which may refuse
    } catch (const Error& e) {
      if (!planner_refusal(e)) throw;
      out.status = ConfigStatus::kInvalid;
      out.reason = std::string("planner: ") + e.what();
      return;
    }
    c.index = i;
    c.job = std::move(job);
    kept[static_cast<size_t>(i)] = 1;
  });
  std::vector<Candidate> survivors;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (kept[i]) survivors.push_back(std::move(candidates[i]));
  }
  std::stable_sort(survivors.begin(), survivors.end(), [&](const Candidate& a, const Candidate& b) {
    return a.order_us(configs[a.index].bounds) < b.order_us(configs[b.index].bounds);
  });
  return survivors;
}

// `to_plan` reordered so that configurations of different layers come first: those with
// the same layers wait on one pairing search (the memo), so threads given distinct layers
// at the start of a batch work instead of waiting. Each configuration's plan does not
// depend on the order, so neither does the result.
std::vector<int64_t> spread_by_layers(const std::vector<Candidate>& candidates,
                                      const std::vector<int64_t>& to_plan) {
  std::vector<std::vector<int64_t>> groups;
  std::map<std::tuple<int64_t, bool, int64_t, int64_t, int64_t, int64_t, int>, size_t> group_of;
  for (int64_t i : to_plan) {
    const ParallelSpec& p = candidates[static_cast<size_t>(i)].job.parallel;
    const auto key = std::make_tuple(p.tp, p.sp, p.cp, p.ep, p.expert_tp, p.micro_batch_size,
                                     static_cast<int>(p.recompute.granularity));
    const auto [it, added] = group_of.emplace(key, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  std::vector<int64_t> spread;
  for (size_t round = 0; spread.size() < to_plan.size(); ++round) {
    for (const std::vector<int64_t>& group : groups) {
      if (round < group.size()) spread.push_back(group[round]);
    }
  }
  return spread;
}

// Plans the sorted candidates batch by batch, pruning against the k-th best times.
void plan_in_batches(const SearchRequest& request, std::vector<Candidate>& candidates,
                     std::vector<ConfigOutcome>& configs) {
  PairingMemo memo;  // configurations that share layers share their pairing searches
  const int64_t n = static_cast<int64_t>(candidates.size());
  for (int64_t start = 0; start < n; start += request.batch) {
    const Bars bars{.dhelix_us = kth_best_us(configs, request.top_k, &ConfigOutcome::dhelix),
                    .megatron_us = kth_best_us(configs, request.top_k, &ConfigOutcome::megatron)};
    const int64_t end = std::min(n, start + request.batch);
    std::vector<int64_t> to_plan;
    for (int64_t i = start; i < end; ++i) {
      const Candidate& c = candidates[i];
      ConfigOutcome& out = configs[c.index];
      if (request.prune && beyond_bars(c, out.bounds, bars)) {
        out.status = ConfigStatus::kPruned;
        out.reason = pruned_reason(c, out.bounds, request.top_k);
      } else {
        to_plan.push_back(i);
      }
    }
    to_plan = spread_by_layers(candidates, to_plan);
    parallel_for(static_cast<int64_t>(to_plan.size()), request.threads, [&](int64_t j) {
      Candidate& c = candidates[to_plan[j]];
      plan_candidate(request, memo, bars, c, configs[c.index]);
    });
    if (request.progress) request.progress(end, n);
  }
}

SearchCounts count(const std::vector<ConfigOutcome>& configs) {
  SearchCounts counts;
  counts.enumerated = static_cast<int64_t>(configs.size());
  for (const ConfigOutcome& c : configs) {
    switch (c.status) {
      case ConfigStatus::kInvalid:
        ++counts.invalid;
        break;
      case ConfigStatus::kNoMemory:
        ++counts.no_memory;
        break;
      case ConfigStatus::kPruned:
        ++counts.pruned;
        break;
      case ConfigStatus::kPlanned:
        ++counts.planned;
        counts.dhelix_fits += c.dhelix.fits ? 1 : 0;
        counts.megatron_fits += c.megatron.fits ? 1 : 0;
        break;
    }
  }
  return counts;
}

std::vector<std::pair<std::string, int64_t>> rejection_reasons(
    const std::vector<ConfigOutcome>& configs) {
  std::map<std::string, int64_t> by_reason;
  for (const ConfigOutcome& c : configs) {
    if (c.status == ConfigStatus::kInvalid || c.status == ConfigStatus::kNoMemory) {
      ++by_reason[c.reason];
    }
  }
  std::vector<std::pair<std::string, int64_t>> reasons(by_reason.begin(), by_reason.end());
  std::stable_sort(reasons.begin(), reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return reasons;
}

}  // namespace

const char* config_status_name(ConfigStatus status) {
  switch (status) {
    case ConfigStatus::kInvalid:
      return "invalid";
    case ConfigStatus::kNoMemory:
      return "no-memory";
    case ConfigStatus::kPruned:
      return "pruned";
    case ConfigStatus::kPlanned:
      return "planned";
  }
  return "?";
}

const ConfigOutcome* SearchResult::best_dhelix() const {
  return dhelix_ranking.empty() ? nullptr : &configs[dhelix_ranking.front()];
}

const ConfigOutcome* SearchResult::best_megatron() const {
  return megatron_ranking.empty() ? nullptr : &configs[megatron_ranking.front()];
}

std::string no_best_reason(const SearchResult& result, PipelineScheme scheme) {
  const bool dhelix = scheme == PipelineScheme::kDHelix;
  if (!(dhelix ? result.dhelix_ranking : result.megatron_ranking).empty()) return "";
  const SearchCounts& n = result.counts;
  const auto plural = [](int64_t count) { return count == 1 ? "" : "s"; };
  if (n.invalid == n.enumerated) {
    return fmt::format(
        "none: each of the {} configuration{} breaks a rule of the job (see the "
        "most common rejections)",
        n.enumerated, plural(n.enumerated));
  }
  // Every configuration the rules allow was refused on memory under this scheme: by the
  // static or in-flight memory test, pruned for no memory, or planned over the budget.
  const int64_t planned_over = n.planned - (dhelix ? n.dhelix_fits : n.megatron_fits);
  const int64_t refused = n.enumerated - n.invalid;
  std::string text = fmt::format(
      "none fits in memory: {} configuration{} refused on memory ({} before planning, {} "
      "planned over the budget",
      refused, plural(refused), n.no_memory + n.pruned, planned_over);
  if (n.invalid > 0) {
    text +=
        fmt::format("; {} more break{} a rule of the job", n.invalid, n.invalid == 1 ? "s" : "");
  }
  return text + ")";
}

JobSpec configuration_job(const JobSpec& base, const ParallelSpec& parallel) {
  JobSpec job = base;
  job.parallel = parallel;
  job.name = base.model.name + " " + configuration_label(parallel, base.model.is_moe());
  return job;
}

SearchResult search_configurations(const SearchRequest& request) {
  check_request(request);
  SearchResult result;
  const std::vector<ParallelSpec> space =
      enumerate_configurations(request.base, request.gpus, request.constraints);
  if (space.empty()) {
    // Nothing to plan is not "nothing fits in memory": say which axis left nothing.
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("--gpus: {}: no parallel configuration to search: {}", request.gpus,
                            empty_space_reason(request.base, request.gpus, request.constraints)));
  }
  for (size_t i = 0; i < space.size(); ++i) {
    ConfigOutcome out;
    out.index = static_cast<int64_t>(i);
    out.parallel = space[i];
    out.label = configuration_label(space[i], request.base.model.is_moe());
    result.configs.push_back(std::move(out));
  }
  std::vector<Candidate> candidates = screen(request, result.configs);
  plan_in_batches(request, candidates, result.configs);
  result.counts = count(result.configs);
  result.dhelix_ranking = ranking(result.configs, request.top_k, &ConfigOutcome::dhelix);
  result.megatron_ranking = ranking(result.configs, request.top_k, &ConfigOutcome::megatron);
  result.rejection_reasons = rejection_reasons(result.configs);
  return result;
}

}  // namespace dhelix
