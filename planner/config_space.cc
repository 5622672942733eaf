#include "planner/config_space.h"

#include <fmt/format.h>

#include <set>
#include <string>

#include "lib/error.h"
#include "lib/stage_split.h"
#include "lib/text.h"

namespace dhelix {
namespace {

std::vector<int64_t> powers_of_two_up_to(int64_t limit) {
  std::vector<int64_t> values;
  for (int64_t v = 1; v <= limit; v *= 2) values.push_back(v);
  return values;
}

// The axis's values: the fixed one if the user gave it, else `candidates`.
std::vector<int64_t> axis(const std::optional<int64_t>& fixed, std::vector<int64_t> candidates) {
  if (fixed) return {*fixed};
  return candidates;
}

std::vector<bool> sp_values(const SearchConstraints& c, int64_t tp) {
  if (tp == 1) return {false};
  if (c.sp) return {*c.sp};
  return {false, true};
}

std::vector<RecomputeSpec> recompute_values(const JobSpec& base, const SearchConstraints& c) {
  if (!c.search_recompute) return {base.parallel.recompute};
  RecomputeSpec none;
  RecomputeSpec selective;
  selective.granularity = RecomputeGranularity::kSelective;
  RecomputeSpec full;
  full.granularity = RecomputeGranularity::kFull;
  full.method = RecomputeMethod::kUniform;
  full.num_layers = 1;
  return {none, selective, full};
}

// A pipeline depth and its stage split: F = La = 0 for even stages.
struct PipelineLayout {
  int64_t pp = 1;
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
};

// The layout of one depth: even stages when 2·pp divides the layers, else the planner's
// own uneven split (F = La = 0 here: the search chooses it with the stage work of each
// configuration, planner/chosen_split.h), when lib/stage_split.h allows any.
std::vector<PipelineLayout> layouts_of_depth(int64_t layers, int64_t pp) {
  if (any_stage_split(layers, pp)) return {{pp, 0, 0}};
  return {};
}

std::vector<PipelineLayout> pipeline_layouts(int64_t layers, const SearchConstraints& c) {
  std::vector<PipelineLayout> layouts;
  for (int64_t pp = 1; pp <= layers; ++pp) {
    if ((c.pp && pp != *c.pp) || (c.max_pp > 0 && pp > c.max_pp)) continue;
    for (const PipelineLayout& layout : layouts_of_depth(layers, pp)) layouts.push_back(layout);
  }
  return layouts;
}

// Expert-parallel sizes: powers of two dividing dp·cp (EP is carved out of that block) and
// the expert count.
std::vector<int64_t> ep_values(const JobSpec& base, const SearchConstraints& c, int64_t dp,
                               int64_t cp) {
  if (!base.model.is_moe()) return {1};
  std::vector<int64_t> values;
  for (int64_t ep : axis(c.ep, powers_of_two_up_to(dp * cp))) {
    if ((dp * cp) % ep == 0 && base.model.moe->num_experts % ep == 0) values.push_back(ep);
  }
  return values;
}

std::vector<int64_t> expert_tp_values(const JobSpec& base, int64_t tp) {
  if (!base.model.is_moe() || tp == 1) return {0};
  return {0, 1};  // 0: as tp (Megatron-Core's default)
}

// Megatron-LM's --cp-comm-type values of a (tp, cp) pair (see the file comment): the fixed
// one, else for cp > 1 p2p, a2a where the heads of a TP rank split over cp, allgather, and
// a2a+p2p with the largest sub-group A < cp (a power of two, at least 2) that stays inside
// a node beside TP (A·tp <= gpus_per_node: NVLink for the all-to-all, as Megatron intends)
// and splits the heads.
struct CpCommChoice {
  CpCommType type = CpCommType::kP2p;
  std::vector<int64_t> hierarchical_sizes;
};

std::vector<CpCommChoice> cp_comm_values(const JobSpec& base, const SearchConstraints& c,
                                         int64_t tp, int64_t cp) {
  const ParallelSpec& b = base.parallel;
  if (cp == 1) return {{b.cp_comm_type, b.hierarchical_cp_sizes}};
  if (c.cp_comm_type) {
    if (*c.cp_comm_type != CpCommType::kA2aP2p) return {{*c.cp_comm_type, {}}};
    return {{*c.cp_comm_type, b.hierarchical_cp_sizes}};
  }
  const ModelSpec& m = base.model;
  const auto splits_heads = [&](int64_t group) {
    return m.num_attention_heads % tp == 0 && m.num_kv_heads % tp == 0 &&
           (m.num_attention_heads / tp) % group == 0 && (m.num_kv_heads / tp) % group == 0;
  };
  std::vector<CpCommChoice> values = {{CpCommType::kP2p, {}}};
  if (splits_heads(cp)) values.push_back({CpCommType::kA2a, {}});
  values.push_back({CpCommType::kAllGather, {}});
  for (int64_t a2a = cp / 2; a2a >= 2; a2a /= 2) {
    if (a2a * tp > base.cluster.gpus_per_node || !splits_heads(a2a)) continue;
    values.push_back({CpCommType::kA2aP2p, {a2a, cp / a2a}});
    break;
  }
  return values;
}

// Megatron-FSDP's settings of one configuration (see the file comment): off unless searched
// or fixed, and off where dp = 1.
struct FsdpChoice {
  bool on = false;
  FsdpShardingStrategy strategy = FsdpShardingStrategy::kNoShard;
};

std::vector<FsdpChoice> fsdp_values(const JobSpec& base, const SearchConstraints& c, int64_t dp,
                                    int64_t cp) {
  const bool asked = c.search_fsdp || c.fsdp_sharding || base.parallel.use_megatron_fsdp;
  if (!asked || dp == 1) return {{}};
  if (c.fsdp_sharding) return {{true, *c.fsdp_sharding}};
  std::vector<FsdpChoice> values = {{true, FsdpShardingStrategy::kOptim}};
  if (cp == 1) values.push_back({true, FsdpShardingStrategy::kOptimGradsParams});
  return values;
}

// The innermost two axes, CP communication type then FSDP strategy, as one list.
std::vector<std::pair<CpCommChoice, FsdpChoice>> comm_and_fsdp(const JobSpec& base,
                                                               const SearchConstraints& c,
                                                               int64_t tp, int64_t cp, int64_t dp) {
  std::vector<std::pair<CpCommChoice, FsdpChoice>> out;
  for (const CpCommChoice& comm : cp_comm_values(base, c, tp, cp)) {
    for (const FsdpChoice& fsdp : fsdp_values(base, c, dp, cp)) out.emplace_back(comm, fsdp);
  }
  return out;
}

// How far the enumeration got along its axes: where an empty space stopped.
struct Funnel {
  int64_t tp_cp = 0;             ///< (tp, sp, cp) the sequence allows
  std::set<int64_t> pp_values;   ///< depths the layers split over (with max_pp, pp)
  std::set<int64_t> dp_values;   ///< dp = gpus / (tp·cp·pp) where that divides
  std::set<int64_t> dp_with_ep;  ///< ... that also match the dp constraint and have an ep
};

std::vector<ParallelSpec> enumerate(const JobSpec& base, int64_t gpus, const SearchConstraints& c,
                                    Funnel* funnel) {
  if (gpus < 1) {
    throw Error(ErrorCode::kInvalidInput, fmt::format("--gpus: {} must be at least 1", gpus));
  }
  const ParallelSpec& b = base.parallel;
  std::vector<ParallelSpec> configs;
  const std::vector<PipelineLayout> layouts = pipeline_layouts(base.model.num_layers, c);
  if (funnel != nullptr) {
    for (const PipelineLayout& layout : layouts) funnel->pp_values.insert(layout.pp);
  }
  for (int64_t tp : axis(c.tp, powers_of_two_up_to(gpus))) {
    for (bool sp : sp_values(c, tp)) {
      const int64_t max_cp = c.allow_cp ? gpus / tp : 1;
      for (int64_t cp : axis(c.cp, powers_of_two_up_to(max_cp))) {
        if (b.seq_length % (2 * cp) != 0 && cp > 1) continue;
        if (funnel != nullptr) ++funnel->tp_cp;
        for (const PipelineLayout& layout : layouts) {
          const int64_t pp = layout.pp;
          if (gpus % (tp * cp * pp) != 0) continue;
          const int64_t dp = gpus / (tp * cp * pp);
          if (funnel != nullptr) funnel->dp_values.insert(dp);
          if (c.dp && *c.dp != dp) continue;
          const std::vector<int64_t> eps = ep_values(base, c, dp, cp);
          if (funnel != nullptr && !eps.empty()) funnel->dp_with_ep.insert(dp);
          for (int64_t ep : eps) {
            for (int64_t expert_tp : expert_tp_values(base, tp)) {
              for (int64_t mbs :
                   axis(c.micro_batch_size, powers_of_two_up_to(c.max_micro_batch_size))) {
                if (b.global_batch_size % (dp * mbs) != 0) continue;
                for (const RecomputeSpec& recompute : recompute_values(base, c)) {
                  for (const auto& [comm, fsdp] : comm_and_fsdp(base, c, tp, cp, dp)) {
                    ParallelSpec p = b;
                    p.use_megatron_fsdp = fsdp.on;
                    p.fsdp_sharding = fsdp.on ? fsdp.strategy : FsdpShardingStrategy::kNoShard;
                    p.fsdp_reshard_after_forward = !fsdp.on || b.fsdp_reshard_after_forward;
                    p.cp_comm_type = comm.type;
                    p.hierarchical_cp_sizes = comm.hierarchical_sizes;
                    p.tp = tp;
                    p.sp = sp;
                    p.cp = cp;
                    p.pp = pp;
                    p.dp = dp;
                    p.ep = ep;
                    p.expert_tp = expert_tp;
                    p.micro_batch_size = mbs;
                    p.recompute = recompute;
                    p.first_stage_layers = layout.first_stage_layers;
                    p.last_stage_layers = layout.last_stage_layers;
                    configs.push_back(p);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return configs;
}

std::string values_text(const std::set<int64_t>& values) {
  std::vector<std::string> parts;
  for (int64_t v : values) parts.push_back(std::to_string(v));
  return join(parts, ", ");
}

}  // namespace

std::vector<ParallelSpec> enumerate_configurations(const JobSpec& base, int64_t gpus,
                                                   const SearchConstraints& c) {
  return enumerate(base, gpus, c, nullptr);
}

std::string empty_space_reason(const JobSpec& base, int64_t gpus, const SearchConstraints& c) {
  Funnel f;
  if (!enumerate(base, gpus, c, &f).empty()) return "";
  const ParallelSpec& b = base.parallel;
  const int64_t layers = base.model.num_layers;
  if (f.tp_cp == 0) {
    return fmt::format(
        "{} GPUs: no tensor- and context-parallel size fits: tp and cp are powers "
        "of two with tp·cp <= {}, and cp > 1 needs seq_length {} divisible by "
        "2·cp{}",
        gpus, gpus, b.seq_length, c.tp || c.cp ? " (tp or cp fixed by a flag)" : "");
  }
  if (f.pp_values.empty()) {
    return fmt::format(
        "{} layers split over no pipeline depth allowed{} (the W folds 2·pp "
        "chunks, lib/stage_split.h)",
        layers,
        c.pp           ? fmt::format(" (--pp {})", *c.pp)
        : c.max_pp > 0 ? fmt::format(" (--max-pp {})", c.max_pp)
                       : std::string());
  }
  const std::string product = base.model.is_moe() ? "tp·cp·pp·dp (ep within dp·cp)" : "tp·cp·pp·dp";
  if (f.dp_values.empty()) {
    return fmt::format(
        "{} GPUs: no {} = {}: tp and cp are powers of two and pp is one of {} (the "
        "depths {} layers split over), and no tp·cp·pp of them divides {}",
        gpus, product, gpus, values_text(f.pp_values), layers, gpus);
  }
  if (c.dp && f.dp_values.count(*c.dp) == 0) {
    return fmt::format("{} GPUs: --dp {} is not {} / (tp·cp·pp) for any layout (dp could be {})",
                       gpus, *c.dp, gpus, values_text(f.dp_values));
  }
  if (f.dp_with_ep.empty()) {
    return fmt::format("{} GPUs: no expert-parallel size divides both dp·cp and num_experts = {}",
                       gpus, base.model.is_moe() ? base.model.moe->num_experts : 0);
  }
  std::set<int64_t> mbs_values;
  for (int64_t m : axis(c.micro_batch_size, powers_of_two_up_to(c.max_micro_batch_size))) {
    mbs_values.insert(m);
  }
  return fmt::format(
      "{} GPUs: every {} = {} has dp in {{{}}}, and no dp·micro_batch_size "
      "(micro_batch_size in {{{}}}) divides global batch {}",
      gpus, product, gpus, values_text(f.dp_with_ep), values_text(mbs_values), b.global_batch_size);
}

std::string configuration_label(const ParallelSpec& p, bool moe) {
  std::string label = fmt::format("tp{}{} cp{}", p.tp, p.sp ? " sp" : "", p.cp);
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kP2p) {  // Megatron's --cp-comm-type
    label += fmt::format("({}", cp_comm_type_name(p.cp_comm_type));
    if (p.cp_comm_type == CpCommType::kA2aP2p && p.hierarchical_cp_sizes.size() == 2)
      label += fmt::format(" {}x{}", p.hierarchical_cp_sizes[0], p.hierarchical_cp_sizes[1]);
    label += ")";
  }
  label += fmt::format(" pp{}", p.pp);
  if (p.account_for_embedding || p.account_for_loss) {  // Megatron's account_for flags
    label += p.account_for_embedding && p.account_for_loss ? "(emb+loss)"
             : p.account_for_embedding                     ? "(emb)"
                                                           : "(loss)";
  } else if (p.uneven_stages()) {
    label += fmt::format("({}/{})", p.first_stage_layers, p.last_stage_layers);
  }
  label += fmt::format(" dp{}", p.dp);
  if (moe) {
    label += fmt::format(" ep{} etp{}", p.ep, p.expert_tp == 0 ? p.tp : p.expert_tp);
  }
  label += fmt::format(" mbs{}", p.micro_batch_size);
  if (p.use_megatron_fsdp) {
    label += fmt::format(" fsdp-{}{}", fsdp_sharding_strategy_name(p.fsdp_sharding),
                         p.fsdp_reshard_after_forward ? "" : "(keep)");
  }
  if (p.recompute.enabled()) {
    label += fmt::format(" rc-{}", recompute_granularity_name(p.recompute.granularity));
  }
  return label;
}

}  // namespace dhelix
