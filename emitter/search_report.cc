#include "emitter/search_report.h"

#include <algorithm>

#include <fmt/format.h>

#include "lib/json_reader.h"
#include "lib/parallel_spec.h"
#include "lib/plan/plan_kinds.h"

namespace dhelix {
namespace {

// 1.1.0: each scheme's figures carry its shape.
constexpr const char* kSearchReportSchemaVersion = "1.1.0";
// The two ranked schemes' keys: the plan's own names for them.
const char* const kDHelix = pipeline_scheme_name(PipelineScheme::kDHelix);
const char* const kMegatron = pipeline_scheme_name(PipelineScheme::kMegatron1F1B);

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

std::string heading(const SearchReportContext& c) {
  return fmt::format("search: {} on {} GPUs ({}), global batch {} x {} tokens\n", c.model, c.gpus,
                     c.cluster, c.global_batch_size, c.seq_length);
}

std::string counts_text(const SearchCounts& n) {
  return fmt::format(
      "configurations: {} enumerated, {} refused by the job's rules, {} without the memory "
      "they need, {} pruned by their lower bound, {} planned ({} fit under dhelix, {} under "
      "Megatron-LM 1F1B)\n",
      n.enumerated, n.invalid, n.no_memory, n.pruned, n.planned, n.dhelix_fits, n.megatron_fits);
}

std::string reasons_text(const SearchResult& r) {
  if (r.rejection_reasons.empty()) return "";
  std::string out = "most common rejections:\n";
  const size_t shown = std::min<size_t>(r.rejection_reasons.size(), 5);
  for (size_t i = 0; i < shown; ++i) {
    out +=
        fmt::format("  {:>6}  {}\n", r.rejection_reasons[i].second, r.rejection_reasons[i].first);
  }
  return out;
}

// `reason`: why there is no best (no_best_reason), shown when `c` is null.
std::string best_line(const char* scheme, const ConfigOutcome* c,
                      SearchSchemeFigures ConfigOutcome::*figures, const std::string& reason) {
  if (c == nullptr) return fmt::format("best {:<18} {}\n", scheme, reason);
  const SearchSchemeFigures& f = (*c).*figures;
  return fmt::format("best {:<18} {:<34} {:>10.3f} s  MFU {:5.1f}%\n", scheme, c->label,
                     f.iteration_us / 1e6, f.mfu * 100);
}

std::string ranking_text(const SearchResult& r, const std::vector<int64_t>& ranking,
                         const char* scheme, SearchSchemeFigures ConfigOutcome::*figures) {
  std::string out = fmt::format("top {} under {}:\n", ranking.size(), scheme);
  out += fmt::format("  {:>4}  {:<34} {:>11} {:>11} {:>6} {:>7} {:>13} {:>10}  {}\n", "rank",
                     "configuration", "iteration", "TFLOPS/GPU", "MFU", "bubble", "exposed comm",
                     "memory", "shape");
  for (size_t i = 0; i < ranking.size(); ++i) {
    const ConfigOutcome& c = r.configs[static_cast<size_t>(ranking[i])];
    const SearchSchemeFigures& f = c.*figures;
    out += fmt::format(
        "  {:>4}  {:<34} {:>9.3f} s {:>11.1f} {:>5.1f}% {:>6.1f}% {:>10.1f} ms "
        "{:>6.1f} GiB  {}\n",
        i + 1, c.label, f.iteration_us / 1e6, f.tflops_per_gpu, f.mfu * 100, f.bubble_ratio * 100,
        f.exposed_comm_us / 1000, gib(f.peak_memory_bytes), pipeline_shape_name(f.shape));
  }
  return out;
}

OrderedJson figures_json(const SearchSchemeFigures& f) {
  OrderedJson j;
  j["iteration_us"] = f.iteration_us;
  j["tokens_per_second"] = f.tokens_per_second;
  j["tflops_per_gpu"] = f.tflops_per_gpu;
  j["mfu"] = f.mfu;
  j["bubble_ratio"] = f.bubble_ratio;
  j["exposed_comm_us"] = f.exposed_comm_us;
  j["peak_memory_bytes"] = f.peak_memory_bytes;
  j["fits"] = f.fits;
  j["shape"] = pipeline_shape_name(f.shape);
  return j;
}

OrderedJson parallel_json(const ParallelSpec& p) {
  OrderedJson j;
  j["tp"] = p.tp;
  j["sp"] = p.sp;
  j["cp"] = p.cp;
  j["pp"] = p.pp;
  j["dp"] = p.dp;
  j["ep"] = p.ep;
  j["expert_tp"] = p.expert_tp == 0 ? p.tp : p.expert_tp;
  j["micro_batch_size"] = p.micro_batch_size;
  j["recompute_granularity"] = recompute_granularity_name(p.recompute.granularity);
  j["first_stage_layers"] = p.first_stage_layers;
  j["last_stage_layers"] = p.last_stage_layers;
  return j;
}

OrderedJson config_json(const ConfigOutcome& c) {
  OrderedJson j;
  j["index"] = c.index;
  j["label"] = c.label;
  j["parallel"] = parallel_json(c.parallel);
  j["status"] = config_status_name(c.status);
  if (!c.reason.empty()) j["reason"] = c.reason;
  if (c.bounds.least_us() > 0) {
    j["lower_bound_us"] = {{kDHelix, c.bounds.dhelix_us}, {kMegatron, c.bounds.megatron_us}};
  }
  if (c.status == ConfigStatus::kNoMemory && c.dhelix.peak_memory_bytes > 0) {
    j["peak_memory_bytes"] = {{kDHelix, c.dhelix.peak_memory_bytes},
                              {kMegatron, c.megatron.peak_memory_bytes}};
  }
  if (c.status == ConfigStatus::kPlanned) {
    j[kDHelix] = figures_json(c.dhelix);
    j[kMegatron] = figures_json(c.megatron);
    OrderedJson baselines = OrderedJson::object();
    for (const auto& [name, figures] : c.baselines) baselines[name] = figures_json(figures);
    j["baselines"] = baselines;
  }
  return j;
}

// The other schemes' best lines: the fastest fitting configuration among those planned.
std::string baseline_lines(const SearchResult& r) {
  std::vector<std::string> names;
  for (const ConfigOutcome& c : r.configs) {
    for (const auto& entry : c.baselines) {
      if (std::find(names.begin(), names.end(), entry.first) == names.end()) {
        names.push_back(entry.first);
      }
    }
  }
  std::string out;
  for (const std::string& name : names) {
    const ConfigOutcome* best = nullptr;
    const SearchSchemeFigures* best_figures = nullptr;
    for (const ConfigOutcome& c : r.configs) {
      for (const auto& [scheme, figures] : c.baselines) {
        if (scheme != name || !figures.fits) continue;
        if (best_figures == nullptr || figures.iteration_us < best_figures->iteration_us) {
          best = &c;
          best_figures = &figures;
        }
      }
    }
    if (best == nullptr) {
      out += fmt::format("best {:<18} none planned fits in memory\n", name + ":");
    } else {
      out += fmt::format("best {:<18} {:<34} {:>10.3f} s  MFU {:5.1f}%  (among those planned)\n",
                         name + ":", best->label, best_figures->iteration_us / 1e6,
                         best_figures->mfu * 100);
    }
  }
  return out;
}

double gain(const SearchResult& r) {
  const ConfigOutcome* d = r.best_dhelix();
  const ConfigOutcome* m = r.best_megatron();
  if (d == nullptr || m == nullptr) return 0;
  return m->megatron.iteration_us / d->dhelix.iteration_us;
}

}  // namespace

std::string search_report_text(const SearchResult& r, const SearchReportContext& context) {
  std::string out = heading(context) + counts_text(r.counts) + reasons_text(r) + "\n";
  out += best_line("dhelix:", r.best_dhelix(), &ConfigOutcome::dhelix,
                   no_best_reason(r, PipelineScheme::kDHelix));
  out += best_line("Megatron-LM 1F1B:", r.best_megatron(), &ConfigOutcome::megatron,
                   no_best_reason(r, PipelineScheme::kMegatron1F1B));
  if (context.all_schemes) out += baseline_lines(r);
  if (gain(r) > 0) {
    const bool same = r.best_dhelix()->index == r.best_megatron()->index;
    out += fmt::format(
        "gain of the best dhelix configuration over the best Megatron-LM one: "
        "{:.2f}x ({})\n",
        gain(r),
        same ? "the same configuration is best for both"
             : "co-execution changes the best configuration");
  }
  out += "\n" + ranking_text(r, r.dhelix_ranking, "dhelix", &ConfigOutcome::dhelix);
  out += "\n" + ranking_text(r, r.megatron_ranking, "Megatron-LM 1F1B", &ConfigOutcome::megatron);
  out += "\nEqual iteration times rank in enumeration order (docs/search.md).\n";
  return out;
}

std::string search_report_json(const SearchResult& r, const SearchReportContext& context) {
  OrderedJson j;
  j["schema_version"] = kSearchReportSchemaVersion;
  j["meta"] = context.meta;
  j["model"] = context.model;
  j["cluster"] = context.cluster;
  j["gpus"] = context.gpus;
  j["global_batch_size"] = context.global_batch_size;
  j["seq_length"] = context.seq_length;
  j["top_k"] = context.top_k;
  const SearchCounts& n = r.counts;
  j["counts"] = {{"enumerated", n.enumerated},
                 {"invalid", n.invalid},
                 {"no_memory", n.no_memory},
                 {"pruned", n.pruned},
                 {"planned", n.planned},
                 {"dhelix_fits", n.dhelix_fits},
                 {"megatron_fits", n.megatron_fits}};
  j["best_dhelix"] = r.best_dhelix() ? OrderedJson(r.best_dhelix()->index) : OrderedJson();
  j["best_megatron"] = r.best_megatron() ? OrderedJson(r.best_megatron()->index) : OrderedJson();
  j["gain"] = gain(r);
  j["dhelix_ranking"] = r.dhelix_ranking;
  j["megatron_ranking"] = r.megatron_ranking;
  OrderedJson reasons = OrderedJson::array();
  for (const auto& [reason, count] : r.rejection_reasons) {
    reasons.push_back({{"reason", reason}, {"count", count}});
  }
  j["rejection_reasons"] = reasons;
  OrderedJson configs = OrderedJson::array();
  for (const ConfigOutcome& c : r.configs) configs.push_back(config_json(c));
  j["configurations"] = configs;
  return j.dump(2) + "\n";
}

}  // namespace dhelix
