#include "lib/job_validation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "lib/divisibility_hints.h"
#include "lib/dtype.h"
#include "lib/job_limits.h"
#include "lib/stage_split.h"

namespace dhelix {
namespace {

// Adds problems about one job, each placed at the origin of the field it concerns.
class Checker {
 public:
  Checker(const JobSpec& job, ProblemList& problems) : job_(job), problems_(problems) {}

  void report(const std::string& field, int64_t value, const std::string& rule) {
    report_text(field, std::to_string(value), rule);
  }
  void report_text(const std::string& field, const std::string& value, const std::string& rule) {
    const FieldOrigin origin = job_.origin_of(field);
    problems_.add(origin.file, origin.pointer, value, rule);
  }

 private:
  const JobSpec& job_;
  ProblemList& problems_;
};

// Sizes must be positive before any divisibility rule means anything; flags can bypass the
// reader's range checks, so validation checks again.
bool check_positive(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const std::pair<const char*, int64_t> sizes[] = {{"dp", p.dp},
                                                   {"tp", p.tp},
                                                   {"cp", p.cp},
                                                   {"pp", p.pp},
                                                   {"ep", p.ep},
                                                   {"micro_batch_size", p.micro_batch_size},
                                                   {"global_batch_size", p.global_batch_size},
                                                   {"seq_length", p.seq_length}};
  bool all_positive = true;
  for (const auto& [name, value] : sizes) {
    if (value >= 1) continue;
    check.report(std::string("parallel.") + name, value, "must be at least 1");
    all_positive = false;
  }
  return all_positive;
}

// Limits (lib/job_limits.h) far above any real job; beyond them the job is refused before
// anything multiplies.
// Bytes of one rank's largest tensor and the parameter count: kept below 2^52 (exact in a
// double) so that byte counts derived from them in int64 cannot overflow.
constexpr int64_t kMaxPerRankSize = int64_t{1} << 52;

// Each size alone within its limit; true when all are, so that products can be formed.
bool check_size_limits(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  struct Limit {
    const char* name;
    int64_t value;
    int64_t max;
    const char* what;
  };
  const Limit limits[] = {
      {"dp", p.dp, kMaxParallelSize, "the largest parallel size"},
      {"tp", p.tp, kMaxParallelSize, "the largest parallel size"},
      {"cp", p.cp, kMaxParallelSize, "the largest parallel size"},
      {"pp", p.pp, kMaxParallelSize, "the largest parallel size"},
      {"ep", p.ep, kMaxParallelSize, "the largest parallel size"},
      {"micro_batch_size", p.micro_batch_size, kMaxBatchSequences, "the largest batch"},
      {"global_batch_size", p.global_batch_size, kMaxBatchSequences, "the largest batch"},
      {"seq_length", p.seq_length, kMaxSeqLength, "the longest sequence"}};
  bool within = true;
  for (const Limit& limit : limits) {
    if (limit.value <= limit.max) continue;
    check.report(std::string("parallel.") + limit.name, limit.value,
                 fmt::format("is more than {}, {} dhelix plans for", limit.max, limit.what));
    within = false;
  }
  return within;
}

// Products of sizes that are each within their limits: the world and the micro-batches of
// one iteration. True when both are within their limits too.
bool check_product_limits(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  bool within = true;
  const std::optional<int64_t> world = p.checked_world_size();
  if (!world || *world > kMaxWorldSize) {
    const std::string product = world ? fmt::format(" = {}", *world) : "";
    check.report_text("parallel", "",
                      fmt::format("world size dp·tp·cp·pp = {}·{}·{}·{}{} is more than {} GPUs, "
                                  "the largest world dhelix plans for",
                                  p.dp, p.tp, p.cp, p.pp, product, kMaxWorldSize));
    within = false;
  }
  // Both factors are at most 2^32 and 2^20: the product fits.
  const std::optional<int64_t> replica_batch = p.checked_replica_batch_size();
  DHELIX_CHECK(replica_batch.has_value());
  const int64_t micro_batches = p.global_batch_size / *replica_batch;
  if (micro_batches > kMaxMicroBatches) {
    check.report("parallel.global_batch_size", p.global_batch_size,
                 fmt::format("gives {} / (micro_batch_size·dp = {}·{}) = {} micro-batches per "
                             "iteration; at most {} are supported",
                             p.global_batch_size, p.micro_batch_size, p.dp, micro_batches,
                             kMaxMicroBatches));
    within = false;
  }
  return within;
}

// What a plan and its rank programs hold grows with the micro-batches times the stages
// (tasks) and times the layers (layer passes): bounded so that planning, checking and
// running a plan cannot exhaust memory (lib/job_limits.h). Called once the micro-batch
// count is within its limit: micro-batches (2^20), pp (2^20) and num_layers (2^16) multiply
// without overflow.
void check_plan_size_limits(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t micro_batches = p.global_batch_size / *p.checked_replica_batch_size();
  if (micro_batches * p.pp > kMaxPipelineTasks) {
    check.report("parallel.global_batch_size", p.global_batch_size,
                 fmt::format("gives {} micro-batches on pp = {} stages = {} pipeline tasks; at "
                             "most {} are supported (the plan lists every task)",
                             micro_batches, p.pp, micro_batches * p.pp, kMaxPipelineTasks));
    return;
  }
  const int64_t layers = job.model.num_layers;
  if (layers > 0 && micro_batches * layers > kMaxLayerPasses) {
    check.report("parallel.global_batch_size", p.global_batch_size,
                 fmt::format("gives {} micro-batches through num_layers = {} layers = {} layer "
                             "passes per iteration; at most {} are supported (each is a run of "
                             "rank-program instructions)",
                             micro_batches, layers, micro_batches * layers, kMaxLayerPasses));
  }
}

// Whole-model parameters, estimated in double so that absurd sizes cannot overflow: Q and O
// projections, K and V, (expert) MLP weights and router, embeddings and head. Norms and
// biases are left out: a bound, not the count (parameter_count() is exact).
struct ParameterEstimate {
  double per_layers = 0;  ///< num_layers · per-layer weights
  double embeddings = 0;  ///< embedding (and untied head, learned positions)
  double total() const { return per_layers + embeddings; }
};

ParameterEstimate estimate_parameters(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double heads = static_cast<double>(m.num_attention_heads);
  const double head_dim = m.head_dim > 0 ? static_cast<double>(m.head_dim)
                          : heads > 0    ? h / heads
                                         : 0;
  const double q_width = heads * head_dim;
  const double kv_width = static_cast<double>(m.num_kv_heads) * head_dim;
  const double matrices = m.activation == ActivationKind::kSwiGlu ? 3 : 2;
  double mlp = matrices * h * static_cast<double>(m.ffn_hidden_size);
  if (m.is_moe()) {
    const double experts = static_cast<double>(m.moe->num_experts);
    mlp = experts * (matrices * h * static_cast<double>(m.moe->expert_ffn_hidden_size) + h) +
          matrices * h * static_cast<double>(m.moe->shared_expert_ffn_hidden_size);
  }
  ParameterEstimate estimate;
  estimate.per_layers =
      static_cast<double>(m.num_layers) * (2 * h * q_width + 2 * h * kv_width + mlp);
  estimate.embeddings = static_cast<double>(m.vocab_size) * h * (m.tied_embeddings ? 1 : 2);
  if (m.position == PositionKind::kLearned) {
    estimate.embeddings += static_cast<double>(m.max_seq_length) * h;
  }
  return estimate;
}

// The largest per-rank tensors (activations, MLP intermediate, fp32 logits) and the
// parameter count must stay below 2^52, so that int64 byte counts downstream cannot
// overflow. Each problem is placed at the model field that makes the size too large.
void check_per_rank_sizes(const JobSpec& job, ProblemList& problems) {
  const ModelSpec& m = job.model;
  const ParallelSpec& p = job.parallel;
  const std::string file = m.source_file.empty() ? "model" : m.source_file;
  const auto report = [&](const char* field, int64_t value, const std::string& rule) {
    problems.add(file, std::string("/") + field, std::to_string(value), rule);
  };
  const double limit = static_cast<double>(kMaxPerRankSize);
  const int64_t tokens = p.tokens_per_rank();  // at most 2^32 · 2^24: fits
  const double tokens_d = static_cast<double>(tokens);
  const double tp = static_cast<double>(p.tp);
  const int64_t dt = dtype_bytes(m.dtype);
  const auto tensor_rule = [&](const char* what, const std::string& formula, double bytes) {
    return fmt::format("makes one rank's {} {} = {:.4g} bytes; at most 2^52 = {} are supported",
                       what, formula, bytes, kMaxPerRankSize);
  };
  const double activation = tokens_d * static_cast<double>(m.hidden_size) * static_cast<double>(dt);
  if (activation > limit) {
    report(
        "hidden_size", m.hidden_size,
        tensor_rule("activation tensor",
                    fmt::format("tokens·hidden_size·bytes = {}·{}·{}", tokens, m.hidden_size, dt),
                    activation));
  }
  const bool moe = m.is_moe();
  const int64_t ffn = moe ? m.moe->expert_ffn_hidden_size : m.ffn_hidden_size;
  const int64_t routed = moe ? m.moe->top_k : 1;
  const double intermediate = tokens_d * static_cast<double>(routed) * static_cast<double>(ffn) /
                              tp * static_cast<double>(dt);
  if (intermediate > limit) {
    report(moe ? "moe/expert_ffn_hidden_size" : "ffn_hidden_size", ffn,
           tensor_rule("MLP intermediate",
                       fmt::format("tokens·top_k·ffn/tp·bytes = {}·{}·{}/{}·{}", tokens, routed,
                                   ffn, p.tp, dt),
                       intermediate));
  }
  const double logits = tokens_d * static_cast<double>(m.vocab_size) / tp * 4;
  if (logits > limit) {
    report(
        "vocab_size", m.vocab_size,
        tensor_rule("fp32 logits",
                    fmt::format("tokens·vocab_size/tp·4 = {}·{}/{}·4", tokens, m.vocab_size, p.tp),
                    logits));
  }
  const ParameterEstimate parameters = estimate_parameters(m);
  if (parameters.total() > limit) {
    const bool layers = parameters.per_layers >= parameters.embeddings;
    report(layers ? "num_layers" : "vocab_size", layers ? m.num_layers : m.vocab_size,
           fmt::format("gives about {:.4g} parameters; at most 2^52 = {} are supported",
                       parameters.total(), kMaxPerRankSize));
  }
}

void check_world_size(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ClusterSpec& c = job.cluster;
  if (c.num_nodes <= 0) return;
  const int64_t gpus = c.num_nodes * c.gpus_per_node;
  if (p.world_size() <= gpus) return;
  // The world size is no one field's fault: the problem sits at the parallel object.
  check.report_text("parallel", "",
                    fmt::format("world size dp·tp·cp·pp = {}·{}·{}·{} = {} is more than cluster "
                                "{} has ({} node{} × {} GPUs = {})",
                                p.dp, p.tp, p.cp, p.pp, p.world_size(), c.name, c.num_nodes,
                                c.num_nodes == 1 ? "" : "s", c.gpus_per_node, gpus));
}

void check_tensor_parallel(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  if (m.num_attention_heads > 0 && m.num_attention_heads % p.tp != 0) {
    check.report("parallel.tp", p.tp,
                 fmt::format("does not divide num_attention_heads = {}", m.num_attention_heads));
  }
  if (m.num_kv_heads > 0 && m.num_kv_heads % p.tp != 0) {
    check.report("parallel.tp", p.tp,
                 fmt::format("does not divide num_kv_heads = {}", m.num_kv_heads));
  }
  if (p.sp && p.tp == 1) {
    check.report_text("parallel.sp", "true",
                      "requires tp > 1 (sequence parallelism splits activations over the TP "
                      "group; tp = 1)");
  }
}

// ----- cost-model settings: expert tensor parallelism -----
void check_expert_tensor_parallel(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  if (p.expert_tp == 0) return;
  if (!m.is_moe()) {
    check.report("parallel.expert_tp", p.expert_tp,
                 fmt::format("requires a mixture-of-experts model ({} is dense)", m.name));
    return;
  }
  if (p.expert_tp != 1 && p.expert_tp != p.tp) {
    check.report("parallel.expert_tp", p.expert_tp,
                 fmt::format("must be 1 or tp = {} (experts split over the whole TP group, or "
                             "whole experts on every TP rank)",
                             p.tp));
    return;
  }
  if (m.moe->expert_ffn_hidden_size % p.expert_tp != 0) {
    check.report("parallel.expert_tp", p.expert_tp,
                 fmt::format("does not divide moe.expert_ffn_hidden_size = {}",
                             m.moe->expert_ffn_hidden_size));
  }
}

void check_expert_parallel(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  check_expert_tensor_parallel(job, check);
  if (p.ep == 1) return;
  if (!m.is_moe()) {
    check.report("parallel.ep", p.ep,
                 fmt::format("requires a mixture-of-experts model ({} is dense)", m.name));
    return;
  }
  if (m.moe->num_experts % p.ep != 0) {
    check.report("parallel.ep", p.ep,
                 fmt::format("does not divide num_experts = {}", m.moe->num_experts));
  }
  if ((p.dp * p.cp) % p.ep != 0) {
    check.report("parallel.ep", p.ep,
                 fmt::format("does not divide dp·cp = {}·{} = {} (EP groups are carved out of "
                             "the data- and context-parallel ranks)",
                             p.dp, p.cp, p.dp * p.cp));
  }
}

// ----- context parallelism: communication type (Megatron-LM's --cp-comm-type) -----
// Ulysses' all-to-all hands each of the A ranks of its group heads/A of every head kind
// (TransformerEngine's a2a splits Q, K and V along heads), so A must divide both the query
// and the KV heads of a TP rank. a2a+p2p takes its sub-group from Megatron's
// --hierarchical-context-parallel-sizes [A, P] (A·P = cp, A adjacent CP ranks).
void check_a2a_heads(const JobSpec& job, Checker& check, int64_t group, const std::string& what) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  const std::pair<const char*, int64_t> counts[] = {{"num_attention_heads", m.num_attention_heads},
                                                    {"num_kv_heads", m.num_kv_heads}};
  for (const auto& [name, heads] : counts) {
    if (heads <= 0 || heads % p.tp != 0 || (heads / p.tp) % group == 0) continue;
    check.report_text("parallel.cp_comm_type", cp_comm_type_name(p.cp_comm_type),
                      fmt::format("splits the heads of each TP rank over {} = {}, which does not "
                                  "divide {} / tp = {} / {} = {} (Ulysses' all-to-all gives "
                                  "every rank of its group an equal share of the query and of "
                                  "the KV heads)",
                                  what, group, name, heads, p.tp, heads / p.tp));
  }
}

void check_cp_comm_type(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const std::vector<int64_t>& sizes = p.hierarchical_cp_sizes;
  const std::string sizes_text = fmt::format("[{}]", fmt::join(sizes, ", "));
  if (p.cp_comm_type != CpCommType::kA2aP2p) {
    if (!sizes.empty()) {
      check.report_text("parallel.hierarchical_context_parallel_sizes", sizes_text,
                        fmt::format("applies to cp_comm_type a2a+p2p only (cp_comm_type is {})",
                                    cp_comm_type_name(p.cp_comm_type)));
    }
    if (p.cp_comm_type == CpCommType::kA2a) check_a2a_heads(job, check, p.cp, "cp");
    return;
  }
  if (sizes.size() != 2 || sizes[0] * sizes[1] != p.cp || sizes[0] < 2 || sizes[1] < 2) {
    check.report_text(
        "parallel.hierarchical_context_parallel_sizes", sizes.empty() ? "(absent)" : sizes_text,
        fmt::format("cp_comm_type a2a+p2p needs two sizes [A, P], each at least 2, with "
                    "A·P = cp = {} (A adjacent CP ranks do the all-to-all, the ring spans P "
                    "sub-groups; Megatron-LM's --hierarchical-context-parallel-sizes)",
                    p.cp));
    return;
  }
  check_a2a_heads(job, check, sizes[0], "the a2a sub-group A");
}

// ----- fully sharded data parallelism (Megatron-LM's --use-megatron-fsdp) -----
// The strategy and reshard_after_forward mean something only under Megatron-FSDP, and
// reshard_after_forward only where the parameters are sharded. FSDP shards over the dp
// ranks, so dp = 1 is refused rather than planned as a silent no-op. The layers shard over
// the dp group, a mixture of experts' experts over the expert-data-parallel group
// (lib/fsdp_sizes.h); Megatron-FSDP shards over dp·cp with context parallelism, which is
// refused. Full recompute replays the forward on the backward's gathered (or kept) weights
// (lib/dag_builder_recompute.cc).
void check_fsdp_settings(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const std::string strategy = fsdp_sharding_strategy_name(p.fsdp_sharding);
  if (!p.use_megatron_fsdp) {
    if (p.fsdp_sharding != FsdpShardingStrategy::kNoShard) {
      check.report_text("parallel.data_parallel_sharding_strategy", strategy,
                        "applies only with use_megatron_fsdp: true (Megatron-LM's "
                        "--data-parallel-sharding-strategy is Megatron-FSDP's)");
    }
    if (!p.fsdp_reshard_after_forward) {
      check.report_text("parallel.fsdp_reshard_after_forward", "false",
                        "applies only with use_megatron_fsdp: true");
    }
    return;
  }
  if (p.dp == 1) {
    check.report("parallel.dp", p.dp,
                 "use_megatron_fsdp shards over the data-parallel ranks: dp = 1 has nothing "
                 "to shard (set dp > 1, or leave use_megatron_fsdp out)");
  }
  if (!p.fsdp_reshard_after_forward && !p.fsdp_shards_parameters()) {
    check.report_text("parallel.fsdp_reshard_after_forward", "false",
                      fmt::format("applies only with data_parallel_sharding_strategy "
                                  "optim_grads_params (it is {}): only then are the "
                                  "parameters gathered",
                                  strategy));
  }
  if (!p.fsdp_shards_parameters()) return;
  const auto refuse = [&](const std::string& field, const std::string& value,
                          const std::string& why) {
    check.report_text(field, value,
                      "is not supported with data_parallel_sharding_strategy "
                      "optim_grads_params in this version (" +
                          why + ")");
  };
  if (p.cp > 1) {
    refuse("parallel.cp", std::to_string(p.cp),
           "Megatron-FSDP shards over dp·cp with context parallelism; dhelix shards over dp "
           "only");
  }
}

// CP's load balancing cuts each sequence into 2·cp chunks (rank i holds chunks i and
// 2·cp−1−i); SP then splits a rank's tokens over the tp ranks. So the sequence must divide
// by 2·cp when cp > 1, times tp when SP is on: 2·TP·CP with both.
void check_sequence(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t cp_factor = p.cp > 1 ? 2 * p.cp : 1;
  const int64_t sp_factor = p.sp ? p.tp : 1;
  const int64_t divisor = cp_factor * sp_factor;
  if (divisor == 1 || p.seq_length % divisor == 0) return;
  std::string formula;
  if (p.cp > 1 && p.sp) {
    formula = fmt::format("2·cp·tp = 2·{}·{}", p.cp, p.tp);
  } else if (p.cp > 1) {
    formula = fmt::format("2·cp = 2·{}", p.cp);
  } else {
    formula = fmt::format("tp (sequence parallel) = {}", p.tp);
  }
  if (p.cp > 1) formula += fmt::format(" = {}", divisor);
  check.report("parallel.seq_length", p.seq_length,
               fmt::format("is not divisible by {} (nearest valid: {})", formula,
                           nearest_multiples_text(p.seq_length, divisor)));
}

void check_batch(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t divisor = p.micro_batch_size * p.dp;
  if (p.global_batch_size % divisor == 0) return;
  check.report("parallel.global_batch_size", p.global_batch_size,
               fmt::format("is not divisible by micro_batch_size·dp = {}·{} = {} (nearest "
                           "valid: {})",
                           p.micro_batch_size, p.dp, divisor,
                           nearest_multiples_text(p.global_batch_size, divisor)));
}

// ----- activation recompute and uneven pipeline stages -----

// Megatron's --decoder-first/last-pipeline-num-layers, or its --account-for-embedding/loss-
// in-pipeline-split flags: the split of lib/stage_split.h.
void check_uneven_stages(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  if (job.model.num_layers <= 0) return;
  std::string why;
  if (split_job_stages(job.model.num_layers, p, why)) return;
  if (p.account_for_embedding || p.account_for_loss) {
    check.report_text(p.account_for_embedding ? "parallel.account_for_embedding_in_pipeline_split"
                                              : "parallel.account_for_loss_in_pipeline_split",
                      "true",
                      fmt::format("cannot split num_layers = {} over pp = {} stages: {}",
                                  job.model.num_layers, p.pp, why));
    return;
  }
  const bool first = p.first_stage_layers > 0;
  check.report(first ? "parallel.decoder_first_pipeline_num_layers"
                     : "parallel.decoder_last_pipeline_num_layers",
               first ? p.first_stage_layers : p.last_stage_layers,
               fmt::format("cannot split num_layers = {} over pp = {} stages: {}",
                           job.model.num_layers, p.pp, why));
}

// Selective recompute has no method or layer count in Megatron; recompute_num_layers must
// be positive (the reader checks files; flags come here).
void check_recompute(const JobSpec& job, Checker& check) {
  const RecomputeSpec& r = job.parallel.recompute;
  if (r.num_layers < 1) {
    check.report("parallel.recompute_num_layers", r.num_layers, "must be at least 1");
  }
  if (r.granularity != RecomputeGranularity::kFull && r.method == RecomputeMethod::kBlock) {
    check.report_text("parallel.recompute_method", "\"block\"",
                      "needs recompute_granularity \"full\" (Megatron's rule: selective "
                      "recompute has no method)");
  }
}

// DHelix folds the model into a U: each of the pp stages holds two chunks of layers (one
// from each end). Without a split from the job, 2·pp equal chunks need num_layers divisible
// by 2·pp; otherwise the planner chooses an uneven split (lib/stage_split_choice.h), which
// exists unless the stages are too many for the layers.
void check_folding(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t layers = job.model.num_layers;
  if (p.uneven_stages()) return check_uneven_stages(job, check);
  if (layers <= 0 || layers % (2 * p.pp) == 0 || any_stage_split(layers, p.pp)) return;
  // 2·pp divides num_layers exactly when pp divides num_layers / 2 (never for odd counts).
  const std::string valid_pp = layers % 2 == 0 ? divisors_text(layers / 2) : "";
  const std::string pp_hint =
      valid_pp.empty() ? "no pp works for odd num_layers" : "valid pp: " + valid_pp;
  check.report("parallel.pp", p.pp,
               fmt::format("does not split num_layers = {} into 2·pp = {} equal folded chunks "
                           "({}; nearest valid num_layers: {}), and no uneven split exists "
                           "either (pp >= 3 needs num_layers >= 2·pp, pp = 2 num_layers >= 4)",
                           layers, 2 * p.pp, pp_hint, nearest_multiples_text(layers, 2 * p.pp)));
}

}  // namespace

ProblemList validate_job(const JobSpec& job) {
  ProblemList problems;
  Checker check(job, problems);
  if (!check_positive(job, check)) return problems;
  // The remaining rules multiply sizes (and planning builds a placement over the world):
  // past the limits they would overflow, so limits come first and stop validation.
  if (!check_size_limits(job, check)) return problems;
  if (!check_product_limits(job, check)) return problems;
  check_plan_size_limits(job, check);
  check_per_rank_sizes(job, problems);
  check_world_size(job, check);
  check_tensor_parallel(job, check);
  check_expert_parallel(job, check);
  check_cp_comm_type(job, check);
  check_sequence(job, check);
  check_batch(job, check);
  check_folding(job, check);
  check_recompute(job, check);
  check_fsdp_settings(job, check);
  return problems;
}

std::vector<std::string> job_warnings(const JobSpec& job) {
  std::vector<std::string> warnings;
  const ParallelSpec& p = job.parallel;
  if (job.model.max_seq_length > 0 && p.seq_length > job.model.max_seq_length) {
    const FieldOrigin origin = job.origin_of("parallel.seq_length");
    warnings.push_back(fmt::format(
        "{}: {}: {} is longer than {}'s max_seq_length = {} (fine for planning; training "
        "needs position embeddings that reach that far)",
        origin.file, origin.pointer, p.seq_length, job.model.name, job.model.max_seq_length));
  }
  return warnings;
}

}  // namespace dhelix
