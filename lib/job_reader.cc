#include "lib/job_reader.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "lib/cluster_reader.h"
#include "lib/did_you_mean.h"
#include "lib/file_kind.h"
#include "lib/job_limits.h"
#include "lib/model_reader.h"
#include "lib/text.h"

namespace dhelix {
namespace {

constexpr const char* kRankOrderRule =
    "must name each of tp, cp, ep, dp, pp once, joined by '-' (e.g. \"tp-cp-ep-dp-pp\")";
constexpr ParallelDim kAllDims[] = {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp,
                                    ParallelDim::kDp, ParallelDim::kPp};

std::string resolve_path(const std::string& base_dir, const std::string& path) {
  if (base_dir.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// Errors of a model or cluster the job refers to become problems of the job, so that one
// run still reports everything. The first code that is not plain invalid input (a file that
// cannot be read, another schema version) decides the exit status.
struct NestedErrors {
  ErrorCode code = ErrorCode::kInvalidInput;

  void add(const Error& error, ProblemList& problems) {
    if (code == ErrorCode::kInvalidInput) code = error.code();
    const std::string message = error.what();
    size_t start = 0;
    while (start <= message.size()) {
      const size_t end = std::min(message.find('\n', start), message.size());
      if (end > start) problems.add("", "", "", message.substr(start, end - start));
      start = end + 1;
    }
  }
};

// A missing model or cluster may still come from a flag: the message says so.
bool present_or_reported(ObjectReader& root, const std::string& key, const std::string& flag) {
  root.allow(key);
  if (!root.is_object() || root.has(key)) return true;
  root.report(key, "",
              fmt::format("is required but missing (give it in the file or with {})", flag));
  return false;
}

ModelSpec read_job_model(ObjectReader& root, const std::string& base_dir, NestedErrors& nested) {
  if (!present_or_reported(root, "model", "--model")) return {};
  const Json* field = root.raw("model", Need::kOptional);
  if (field == nullptr) return {};
  ProblemList& problems = root.problems();
  try {
    if (field->is_string())
      return read_model_file(resolve_path(base_dir, field->get<std::string>()));
    if (field->is_object()) {
      ModelSpec model = model_from_json(*field, root.file(), problems, root.pointer_of("model"));
      model.source_file = root.file();  // the bytes it came from, for provenance
      return model;
    }
    root.report("model", json_value_text(*field),
                "must be a path to a model file or a model object");
  } catch (const Error& error) {
    nested.add(error, problems);
  }
  return {};
}

ClusterSpec read_job_cluster(ObjectReader& root, const std::string& base_dir,
                             NestedErrors& nested) {
  if (!present_or_reported(root, "cluster", "--cluster")) return {};
  const Json* field = root.raw("cluster", Need::kOptional);
  if (field == nullptr) return {};
  ProblemList& problems = root.problems();
  try {
    if (field->is_string()) {
      return cluster_from_reference(field->get<std::string>(), base_dir, root.file(),
                                    root.pointer_of("cluster"));
    }
    if (field->is_object()) {
      ClusterSpec cluster =
          cluster_from_json(*field, root.file(), problems, root.pointer_of("cluster"));
      cluster.source_file = root.file();
      return cluster;
    }
    root.report("cluster", json_value_text(*field),
                "must be a preset name, a path to a cluster file or a cluster object");
  } catch (const Error& error) {
    nested.add(error, problems);
  }
  return {};
}

// A size within `range` (lib/job_limits.h): an absurd value is refused here, with its
// pointer, before anything is sized from it.
void read_size(ObjectReader& parallel, const std::string& key, int64_t& out,
               IntRange range = kParallelSizeRange) {
  if (auto value = parallel.integer(key, Need::kOptional, range)) out = *value;
}

// ----- activation recompute and uneven pipeline stages -----
// Megatron's flag names in snake case: recompute_granularity ("full" | "selective"),
// recompute_method ("uniform" | "block"), recompute_num_layers,
// decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
// account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split.
void read_recompute_and_stages(ObjectReader& parallel, ParallelSpec& spec) {
  if (auto g = parallel.string("recompute_granularity", Need::kOptional,
                               {"none", "full", "selective"})) {
    spec.recompute.granularity = *g == "full"        ? RecomputeGranularity::kFull
                                 : *g == "selective" ? RecomputeGranularity::kSelective
                                                     : RecomputeGranularity::kNone;
  }
  if (auto m = parallel.string("recompute_method", Need::kOptional, {"uniform", "block"})) {
    spec.recompute.method = *m == "block" ? RecomputeMethod::kBlock : RecomputeMethod::kUniform;
  }
  read_size(parallel, "recompute_num_layers", spec.recompute.num_layers, kLayerSettingRange);
  read_size(parallel, "decoder_first_pipeline_num_layers", spec.first_stage_layers,
            kLayerSettingRange);
  read_size(parallel, "decoder_last_pipeline_num_layers", spec.last_stage_layers,
            kLayerSettingRange);
  if (auto on = parallel.boolean("account_for_embedding_in_pipeline_split", Need::kOptional))
    spec.account_for_embedding = *on;
  if (auto on = parallel.boolean("account_for_loss_in_pipeline_split", Need::kOptional))
    spec.account_for_loss = *on;
}
// Megatron-LM's --cp-comm-type and --hierarchical-context-parallel-sizes (two levels: the
// a2a sub-group, then the ring; lib/job_validation.cc checks them against cp and the heads).
void read_cp_comm_type(ObjectReader& parallel, ParallelSpec& spec) {
  if (auto type = parallel.string("cp_comm_type", Need::kOptional, kCpCommTypeNames.all()))
    spec.cp_comm_type = *kCpCommTypeNames.parse(*type);
  const Json* sizes = parallel.raw("hierarchical_context_parallel_sizes", Need::kOptional);
  if (sizes == nullptr) return;
  const auto in_range = [](const Json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 1 &&
           v.get<int64_t>() <= kParallelSizeRange.max;
  };
  if (!sizes->is_array() || sizes->empty() ||
      !std::all_of(sizes->begin(), sizes->end(), in_range)) {
    parallel.report("hierarchical_context_parallel_sizes", json_value_text(*sizes),
                    fmt::format("must be a list of integers in 1..{} (Megatron-LM's "
                                "--hierarchical-context-parallel-sizes: [A, P], A adjacent CP "
                                "ranks form an all-to-all sub-group, the ring spans P of them)",
                                kParallelSizeRange.max));
    return;
  }
  spec.hierarchical_cp_sizes = sizes->get<std::vector<int64_t>>();
}

// Megatron-LM's --use-megatron-fsdp and --data-parallel-sharding-strategy, PyTorch FSDP2's
// reshard_after_forward (lib/job_validation.cc checks them against dp and the model).
void read_fsdp(ObjectReader& parallel, ParallelSpec& spec) {
  if (auto on = parallel.boolean("use_megatron_fsdp", Need::kOptional))
    spec.use_megatron_fsdp = *on;
  if (auto strategy = parallel.string("data_parallel_sharding_strategy", Need::kOptional,
                                      kFsdpShardingStrategyNames.all()))
    spec.fsdp_sharding = *kFsdpShardingStrategyNames.parse(*strategy);
  if (auto on = parallel.boolean("fsdp_reshard_after_forward", Need::kOptional))
    spec.fsdp_reshard_after_forward = *on;
}

// ----- cost-model settings: communication overlap and MoE routing -----
void read_cost_model_settings(ObjectReader& parallel, ParallelSpec& spec) {
  if (auto on = parallel.boolean("overlap_grad_reduce", Need::kOptional))
    spec.overlap_grad_reduce = *on;
  if (auto on = parallel.boolean("grad_reduce_in_bf16", Need::kOptional))
    spec.grad_reduce_in_bf16 = *on;
  if (auto on = parallel.boolean("overlap_param_gather", Need::kOptional))
    spec.overlap_param_gather = *on;
  read_size(parallel, "expert_tp", spec.expert_tp);
  if (auto factor =
          parallel.real("moe_load_imbalance", Need::kOptional, {.min = 1.0, .max = 1024.0}))
    spec.moe_load_imbalance = *factor;
  if (auto heads = parallel.string("cp_ring_heads", Need::kOptional, {"kv", "query"}))
    spec.cp_ring_query_heads = *heads == "query";
  if (auto sync = parallel.string("block_sync", Need::kOptional, {"event", "host"}))
    spec.host_synchronized_blocks = *sync == "host";
  read_cp_comm_type(parallel, spec);
  read_fsdp(parallel, spec);
}
// ----- end of cost-model settings -----

ParallelSpec read_parallel(ObjectReader& parallel) {
  ParallelSpec spec;
  read_size(parallel, "dp", spec.dp);
  read_size(parallel, "tp", spec.tp);
  read_size(parallel, "cp", spec.cp);
  read_size(parallel, "pp", spec.pp);
  read_size(parallel, "ep", spec.ep);
  if (auto sp = parallel.boolean("sp", Need::kOptional)) spec.sp = *sp;
  read_size(parallel, "micro_batch_size", spec.micro_batch_size, kBatchSequencesRange);
  if (auto gbs = parallel.integer("global_batch_size", Need::kRequired, kBatchSequencesRange)) {
    spec.global_batch_size = *gbs;
  }
  if (auto seq = parallel.integer("seq_length", Need::kRequired, kSeqLengthSettingRange)) {
    spec.seq_length = *seq;
  }
  read_cost_model_settings(parallel, spec);
  if (auto text = parallel.string("rank_order", Need::kOptional)) {
    std::string why;
    if (auto order = parse_rank_order(*text, why)) {
      spec.rank_order = *order;
    } else {
      parallel.report("rank_order", json_value_text(Json(*text)), why);
    }
  }
  read_recompute_and_stages(parallel, spec);
  parallel.finish();
  return spec;
}

}  // namespace

std::optional<std::vector<ParallelDim>> parse_rank_order(const std::string& text,
                                                         std::string& why) {
  std::vector<std::string> names;
  for (ParallelDim dim : kAllDims) names.emplace_back(parallel_dim_name(dim));
  std::vector<ParallelDim> order;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find('-', start), text.size());
    const std::string word = text.substr(start, end - start);
    auto it = std::find(names.begin(), names.end(), word);
    if (word.empty()) {
      why = kRankOrderRule;
      return std::nullopt;
    }
    if (it == names.end()) {
      why = fmt::format("has \"{}\", which is not one of tp, cp, ep, dp, pp{}", word,
                        did_you_mean(word, names));
      return std::nullopt;
    }
    const ParallelDim dim = kAllDims[it - names.begin()];
    if (std::find(order.begin(), order.end(), dim) != order.end()) {
      why = fmt::format("names \"{}\" twice; each of tp, cp, ep, dp, pp must appear once", word);
      return std::nullopt;
    }
    order.push_back(dim);
    if (end == text.size()) break;
    start = end + 1;
  }
  if (order.size() != names.size()) {
    why = kRankOrderRule;
    return std::nullopt;
  }
  return order;
}

ClusterSpec cluster_from_reference(const std::string& preset_or_path, const std::string& base_dir,
                                   const std::string& file, const std::string& pointer) {
  const std::vector<std::string> presets = cluster_preset_names();
  if (std::find(presets.begin(), presets.end(), preset_or_path) != presets.end()) {
    return cluster_preset(preset_or_path);
  }
  const std::string path = resolve_path(base_dir, preset_or_path);
  // The error_code form: a name the file system refuses (too long, say) is no file, not a
  // crash.
  std::error_code ignored;
  const bool looks_like_path = preset_or_path.find('/') != std::string::npos ||
                               preset_or_path.ends_with(".json") ||
                               std::filesystem::exists(path, ignored);
  if (looks_like_path) return read_cluster(path);
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: {}: \"{}\" is neither a cluster preset ({}) nor a cluster file{}",
                          file, pointer, preset_or_path, join(presets, ", "),
                          did_you_mean(preset_or_path, presets)));
}

JobSpec job_from_json(const Json& json, const std::string& file, const std::string& base_dir,
                      ProblemList& problems, JobSupplied supplied) {
  JobSpec job;
  job.source_file = file;
  ObjectReader root(json, file, "", problems);
  if (!root.is_object()) return job;
  root.allow("$schema");
  check_schema_version(root, kJobSchemaMajor);
  if (auto name = root.string("name", Need::kRequired)) job.name = *name;
  root.string("description", Need::kOptional);
  NestedErrors nested;
  if (supplied.model) {
    root.allow("model");
  } else {
    job.model = read_job_model(root, base_dir, nested);
  }
  if (supplied.cluster) {
    root.allow("cluster");
  } else {
    job.cluster = read_job_cluster(root, base_dir, nested);
  }
  if (auto parallel = root.object("parallel", Need::kRequired)) {
    job.parallel = read_parallel(*parallel);
  }
  root.finish();
  if (nested.code != ErrorCode::kInvalidInput) problems.throw_if_any(nested.code);
  return job;
}

JobSpec read_job_file(const std::string& path, JobSupplied supplied) {
  const Json json = read_json_file(path);
  require_file_kind(json, path, FileKind::kJob);
  ProblemList problems;
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  JobSpec job = job_from_json(json, path, base_dir, problems, supplied);
  problems.throw_if_any();
  return job;
}

OrderedJson parallel_to_json(const ParallelSpec& parallel) {
  OrderedJson json;
  json["dp"] = parallel.dp;
  json["tp"] = parallel.tp;
  json["sp"] = parallel.sp;
  json["cp"] = parallel.cp;
  json["pp"] = parallel.pp;
  json["ep"] = parallel.ep;
  json["micro_batch_size"] = parallel.micro_batch_size;
  json["global_batch_size"] = parallel.global_batch_size;
  json["seq_length"] = parallel.seq_length;
  json["rank_order"] = rank_order_text(parallel.rank_order);
  // Recompute and uneven stages: written only when set, so that plans of jobs without them
  // stay as they were.
  if (parallel.recompute.enabled()) {
    json["recompute_granularity"] = recompute_granularity_name(parallel.recompute.granularity);
    if (parallel.recompute.granularity == RecomputeGranularity::kFull) {
      json["recompute_method"] = recompute_method_name(parallel.recompute.method);
      json["recompute_num_layers"] = parallel.recompute.num_layers;
    }
  }
  if (parallel.first_stage_layers > 0) {
    json["decoder_first_pipeline_num_layers"] = parallel.first_stage_layers;
  }
  if (parallel.last_stage_layers > 0) {
    json["decoder_last_pipeline_num_layers"] = parallel.last_stage_layers;
  }
  if (parallel.account_for_embedding) json["account_for_embedding_in_pipeline_split"] = true;
  if (parallel.account_for_loss) json["account_for_loss_in_pipeline_split"] = true;
  // cost-model settings
  if (!parallel.overlap_grad_reduce) json["overlap_grad_reduce"] = false;
  if (parallel.grad_reduce_in_bf16) json["grad_reduce_in_bf16"] = true;
  if (!parallel.overlap_param_gather) json["overlap_param_gather"] = false;
  if (parallel.expert_tp > 0) json["expert_tp"] = parallel.expert_tp;
  if (parallel.moe_load_imbalance) json["moe_load_imbalance"] = *parallel.moe_load_imbalance;
  if (parallel.cp_ring_query_heads) json["cp_ring_heads"] = "query";
  if (parallel.host_synchronized_blocks) json["block_sync"] = "host";
  if (parallel.cp_comm_type != CpCommType::kP2p)
    json["cp_comm_type"] = cp_comm_type_name(parallel.cp_comm_type);
  if (!parallel.hierarchical_cp_sizes.empty())
    json["hierarchical_context_parallel_sizes"] = parallel.hierarchical_cp_sizes;
  if (parallel.use_megatron_fsdp) json["use_megatron_fsdp"] = true;
  if (parallel.fsdp_sharding != FsdpShardingStrategy::kNoShard)
    json["data_parallel_sharding_strategy"] = fsdp_sharding_strategy_name(parallel.fsdp_sharding);
  if (!parallel.fsdp_reshard_after_forward) json["fsdp_reshard_after_forward"] = false;
  return json;
}

}  // namespace dhelix
