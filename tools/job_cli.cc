#include "tools/job_cli.h"

#include <fmt/format.h>

#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/model_shape_checks.h"
#include "lib/text.h"
#include "tools/option_values.h"

namespace dhelix {
namespace {

constexpr const char* kFlags = "<flags>";

// The flags' ranges: those lib/job_validation.cc checks the job against (a flag under
// --search skips that validation, so the flag itself is bounded), and the model's layer
// count (lib/model_shape_checks.h). 0 and negative sizes are never meaningful. Each flag's
// names start with the short one ("--tp,--tensor-model-parallel-size"): messages name it.
constexpr IntRange kParallelSizeRange = {.min = 1, .max = int64_t{1} << 20};
constexpr IntRange kBatchRange = {.min = 1, .max = int64_t{1} << 32};

// One flag's value replaces the job's, and validation messages then point at the flag.
void override_size(JobSpec& job, const std::optional<int64_t>& value, int64_t& field,
                   const std::string& field_name, const std::string& flag) {
  if (!value) return;
  field = *value;
  job.origins[field_name] = {kFlags, flag};
}

// ----- activation recompute and uneven pipeline stages -----
void apply_recompute_and_stage_overrides(const JobOptions& options, JobSpec& job) {
  ParallelSpec& p = job.parallel;
  if (options.recompute_granularity) {
    const std::string& g = *options.recompute_granularity;
    p.recompute.granularity = g == "full"        ? RecomputeGranularity::kFull
                              : g == "selective" ? RecomputeGranularity::kSelective
                                                 : RecomputeGranularity::kNone;
    job.origins["parallel.recompute_granularity"] = {kFlags, "--recompute-granularity"};
  }
  if (options.recompute_method) {
    p.recompute.method =
        *options.recompute_method == "block" ? RecomputeMethod::kBlock : RecomputeMethod::kUniform;
    job.origins["parallel.recompute_method"] = {kFlags, "--recompute-method"};
  }
  override_size(job, options.recompute_num_layers, p.recompute.num_layers,
                "parallel.recompute_num_layers", "--recompute-num-layers");
  override_size(job, options.first_stage_layers, p.first_stage_layers,
                "parallel.decoder_first_pipeline_num_layers",
                "--decoder-first-pipeline-num-layers");
  override_size(job, options.last_stage_layers, p.last_stage_layers,
                "parallel.decoder_last_pipeline_num_layers", "--decoder-last-pipeline-num-layers");
  // Megatron's store_true flags: they can only turn the split on.
  if (options.account_for_embedding) {
    p.account_for_embedding = true;
    job.origins["parallel.account_for_embedding_in_pipeline_split"] = {
        kFlags, "--account-for-embedding-in-pipeline-split"};
  }
  if (options.account_for_loss) {
    p.account_for_loss = true;
    job.origins["parallel.account_for_loss_in_pipeline_split"] = {
        kFlags, "--account-for-loss-in-pipeline-split"};
  }
}

void add_recompute_and_stage_options(CLI::App& app, JobOptions& options) {
  app.add_option("--recompute-granularity", options.recompute_granularity,
                 "Activation recompute: full (whole layers) or selective (core attention)")
      ->check(CLI::IsMember({"none", "full", "selective"}))
      ->type_name("full|selective");
  app.add_option("--recompute-method", options.recompute_method,
                 "Full recompute: uniform (every layer, groups of --recompute-num-layers) or "
                 "block (the first --recompute-num-layers layers of each chunk)")
      ->check(CLI::IsMember({"uniform", "block"}))
      ->type_name("uniform|block");
  add_integer_option(app, "--recompute-num-layers", options.recompute_num_layers, kLayerCountRange,
                     "Layers per recompute group (uniform) or recomputed per chunk (block)");
  add_integer_option(app, "--decoder-first-pipeline-num-layers", options.first_stage_layers,
                     kLayerCountRange,
                     "Transformer layers on the first pipeline stage (uneven stages)");
  add_integer_option(app, "--decoder-last-pipeline-num-layers", options.last_stage_layers,
                     kLayerCountRange,
                     "Transformer layers on the last pipeline stage (uneven stages)");
  app.add_flag("--account-for-embedding-in-pipeline-split", options.account_for_embedding,
               "Count the embedding as a layer when splitting the layers over the stages "
               "(the first stage builds one layer fewer)");
  app.add_flag("--account-for-loss-in-pipeline-split", options.account_for_loss,
               "Count the loss as a layer when splitting the layers over the stages (the "
               "last stage builds one layer fewer)");
}

// ----- fully sharded data parallelism (validation checks the combination) -----
void apply_fsdp_overrides(const JobOptions& options, JobSpec& job) {
  ParallelSpec& p = job.parallel;
  if (options.use_megatron_fsdp) {
    p.use_megatron_fsdp = true;
    job.origins["parallel.use_megatron_fsdp"] = {kFlags, "--use-megatron-fsdp"};
  }
  if (options.fsdp_sharding) {
    p.fsdp_sharding = *kFsdpShardingStrategyNames.parse(*options.fsdp_sharding);
    job.origins["parallel.data_parallel_sharding_strategy"] = {kFlags,
                                                               "--data-parallel-sharding-strategy"};
  }
  if (options.fsdp_reshard_after_forward) {
    p.fsdp_reshard_after_forward = *options.fsdp_reshard_after_forward;
    job.origins["parallel.fsdp_reshard_after_forward"] = {
        kFlags, *options.fsdp_reshard_after_forward ? "--fsdp-reshard-after-forward"
                                                    : "--no-fsdp-reshard-after-forward"};
  }
}

// ----- cost-model settings: communication overlap and MoE routing -----
void apply_cost_model_overrides(const JobOptions& options, JobSpec& job) {
  ParallelSpec& p = job.parallel;
  override_size(job, options.expert_tp, p.expert_tp, "parallel.expert_tp",
                "--expert-tensor-parallel-size");
  if (options.moe_load_imbalance) {
    if (!(*options.moe_load_imbalance >= 1.0 && *options.moe_load_imbalance <= 1024.0)) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("{}: --moe-load-imbalance: {} is not in [1, 1024] (the busiest "
                              "expert's tokens over the mean)",
                              kFlags, *options.moe_load_imbalance));
    }
    p.moe_load_imbalance = *options.moe_load_imbalance;
    job.origins["parallel.moe_load_imbalance"] = {kFlags, "--moe-load-imbalance"};
  }
  if (options.overlap_grad_reduce) p.overlap_grad_reduce = *options.overlap_grad_reduce;
  if (options.overlap_param_gather) p.overlap_param_gather = *options.overlap_param_gather;
  if (options.grad_reduce_in_bf16) p.grad_reduce_in_bf16 = true;
  if (options.cp_comm_type) {
    // CLI checks the spelling (add_job_options); validation checks it against cp and heads.
    p.cp_comm_type = *kCpCommTypeNames.parse(*options.cp_comm_type);
    job.origins["parallel.cp_comm_type"] = {kFlags, "--cp-comm-type"};
  }
  if (!options.hierarchical_cp_sizes.empty()) {
    p.hierarchical_cp_sizes = options.hierarchical_cp_sizes;
    job.origins["parallel.hierarchical_context_parallel_sizes"] = {
        kFlags, "--hierarchical-context-parallel-sizes"};
  }
  apply_fsdp_overrides(options, job);
}

void apply_overrides(const JobOptions& options, JobSpec& job) {
  ParallelSpec& p = job.parallel;
  override_size(job, options.dp, p.dp, "parallel.dp", "--dp");
  override_size(job, options.tp, p.tp, "parallel.tp", "--tp");
  override_size(job, options.cp, p.cp, "parallel.cp", "--cp");
  override_size(job, options.pp, p.pp, "parallel.pp", "--pp");
  override_size(job, options.ep, p.ep, "parallel.ep", "--ep");
  override_size(job, options.micro_batch_size, p.micro_batch_size, "parallel.micro_batch_size",
                "--mbs");
  override_size(job, options.global_batch_size, p.global_batch_size, "parallel.global_batch_size",
                "--gbs");
  override_size(job, options.seq_length, p.seq_length, "parallel.seq_length", "--seq");
  if (options.sp) {
    p.sp = *options.sp;
    job.origins["parallel.sp"] = {kFlags, *options.sp ? "--sp" : "--no-sp"};
  }
  if (options.rank_order) {
    std::string why;
    auto order = parse_rank_order(*options.rank_order, why);
    if (!order) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("{}: --rank-order: \"{}\" {}", kFlags, *options.rank_order, why));
    }
    p.rank_order = *order;
    job.origins["parallel.rank_order"] = {kFlags, "--rank-order"};
  }
  apply_recompute_and_stage_overrides(options, job);
  apply_cost_model_overrides(options, job);
}

// A job from flags alone: every field points at a flag.
JobSpec job_from_flags(const JobOptions& options) {
  std::vector<std::string> missing;
  if (options.model_file.empty()) missing.emplace_back("--model");
  if (options.cluster.empty()) missing.emplace_back("--cluster");
  if (!options.global_batch_size) missing.emplace_back("--gbs");
  if (!options.seq_length) missing.emplace_back("--seq");
  if (!missing.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: no job file given, so --model, --cluster, --gbs and --seq are "
                            "required (missing: {})",
                            kFlags, join(missing, ", ")));
  }
  JobSpec job;
  job.source_file = kFlags;
  const char* fields[] = {"dp", "tp", "cp", "pp", "ep", "sp", "micro_batch_size"};
  const char* flags[] = {"--dp", "--tp", "--cp", "--pp", "--ep", "--sp", "--mbs"};
  for (size_t i = 0; i < std::size(fields); ++i) {
    job.origins[std::string("parallel.") + fields[i]] = {kFlags, flags[i]};
  }
  job.origins["parallel"] = {kFlags, "--dp/--tp/--cp/--pp"};
  return job;
}

}  // namespace

void add_job_options(CLI::App& app, JobOptions& options) {
  app.add_option("JOB", options.job_file, "Job file (schemas/job.schema.json)")->type_name("FILE");
  app.add_option("--model", options.model_file,
                 "Model file (dhelix model JSON or HuggingFace config.json)")
      ->type_name("FILE");
  app.add_option("--cluster", options.cluster, "Cluster preset (a40, a800, h100, h200) or file")
      ->type_name("FILE|PRESET");
  add_integer_option(app, "--dp,--data-parallel-size", options.dp, kParallelSizeRange,
                     "Data-parallel size");
  add_integer_option(app, "--tp,--tensor-model-parallel-size", options.tp, kParallelSizeRange,
                     "Tensor-parallel size");
  add_integer_option(app, "--pp,--pipeline-model-parallel-size", options.pp, kParallelSizeRange,
                     "Pipeline stages");
  add_integer_option(app, "--cp,--context-parallel-size", options.cp, kParallelSizeRange,
                     "Context-parallel size");
  add_integer_option(app, "--ep,--expert-model-parallel-size", options.ep, kParallelSizeRange,
                     "Expert-parallel size");
  // Two flags that exclude each other: `--sp --no-sp` is an error, not "the last one wins".
  CLI::Option* sp_on = app.add_flag_callback(
      "--sp,--sequence-parallel", [&options] { options.sp = true; }, "Sequence parallelism on");
  CLI::Option* sp_off = app.add_flag_callback(
      "--no-sp", [&options] { options.sp = false; }, "Sequence parallelism off");
  sp_on->excludes(sp_off);
  add_integer_option(app, "--mbs,--micro-batch-size", options.micro_batch_size, kBatchRange,
                     "Sequences per micro-batch per data-parallel replica");
  add_integer_option(app, "--gbs,--global-batch-size", options.global_batch_size, kBatchRange,
                     "Sequences per iteration over all replicas");
  add_integer_option(app, "--seq,--seq-length", options.seq_length, kSeqLengthRange,
                     "Tokens per sequence");
  app.add_option_function<std::string>(
         "--rank-order", [&options](const std::string& value) { options.rank_order = value; },
         "Rank order, fastest first (default tp-cp-ep-dp-pp)")
      ->type_name("ORDER");
  add_recompute_and_stage_options(app, options);
  // cost-model settings
  add_integer_option(app, "--expert-tensor-parallel-size", options.expert_tp, kParallelSizeRange,
                     "TP ranks each expert is split over (default: --tp, as Megatron-Core)");
  app.add_option_function<double>(
         "--moe-load-imbalance", [&options](double value) { options.moe_load_imbalance = value; },
         "Busiest expert's tokens over the mean (default 1.72, docs/cost-model.md)")
      ->type_name("NUMBER");
  app.add_flag_function(
      "--overlap-grad-reduce,!--no-overlap-grad-reduce",
      [&options](int64_t count) { options.overlap_grad_reduce = count > 0; },
      "DP gradient reduction under the backward (default on; --no-...: exposed)");
  app.add_flag_function(
      "--overlap-param-gather,!--no-overlap-param-gather",
      [&options](int64_t count) { options.overlap_param_gather = count > 0; },
      "DP parameter all-gather under the forward (default on; --no-...: exposed)");
  app.add_flag("--grad-reduce-in-bf16", options.grad_reduce_in_bf16,
               "Main gradients and their DP reduction in bf16 (Megatron's default: fp32)");
  app.add_option_function<std::string>(
         "--cp-comm-type", [&options](const std::string& value) { options.cp_comm_type = value; },
         "Context-parallel communication: p2p (K/V ring, default), a2a (Ulysses), allgather, "
         "a2a+p2p (docs/cost-model.md)")
      ->type_name("TYPE")
      ->check(CLI::IsMember(kCpCommTypeNames.all()));
  app.add_option("--hierarchical-context-parallel-sizes", options.hierarchical_cp_sizes,
                 "a2a+p2p: A P, A adjacent CP ranks do the all-to-all, the ring spans P of "
                 "them (A·P = --cp)")
      ->type_name("A P")
      ->expected(1, 8)
      ->check(CLI::Range(int64_t{1}, kParallelSizeRange.max));
  app.add_flag("--use-megatron-fsdp", options.use_megatron_fsdp,
               "Megatron-FSDP: shard over the data-parallel ranks what "
               "--data-parallel-sharding-strategy names (docs/cost-model.md)");
  app.add_option_function<std::string>(
         "--data-parallel-sharding-strategy",
         [&options](const std::string& value) { options.fsdp_sharding = value; },
         "With --use-megatron-fsdp: no_shard (default), optim (ZeRO-1), optim_grads (ZeRO-2), "
         "optim_grads_params (ZeRO-3: per-layer parameter gathers and gradient "
         "reduce-scatters)")
      ->type_name("STRATEGY")
      ->check(CLI::IsMember(kFsdpShardingStrategyNames.all()));
  app.add_flag_function(
      "--fsdp-reshard-after-forward,!--no-fsdp-reshard-after-forward",
      [&options](int64_t count) { options.fsdp_reshard_after_forward = count > 0; },
      "optim_grads_params: free the gathered parameters after each layer's forward and "
      "gather them again for its backward (default on; --no-...: keep them until the "
      "micro-batch's backward ends)");
}

JobSpec load_unvalidated_job(const JobOptions& options) {
  const JobSupplied supplied{.model = !options.model_file.empty(),
                             .cluster = !options.cluster.empty()};
  JobSpec job = options.job_file.empty() ? job_from_flags(options)
                                         : read_job_file(options.job_file, supplied);
  if (!options.model_file.empty()) job.model = read_model_file(options.model_file);
  if (!options.cluster.empty()) {
    job.cluster = cluster_from_reference(options.cluster, "", kFlags, "--cluster");
  }
  if (job.name.empty()) job.name = job.model.name + "-" + job.cluster.name;
  apply_overrides(options, job);
  return job;
}

JobSpec load_job(const JobOptions& options) {
  JobSpec job = load_unvalidated_job(options);
  validate_job(job).throw_if_any();
  return job;
}

std::vector<std::string> job_input_files(const JobSpec& job) {
  std::vector<std::string> files;
  if (job.source_file != kFlags) files.push_back(job.source_file);
  files.push_back(job.model.source_file);
  files.push_back(job.cluster.source_file);
  return files;
}

}  // namespace dhelix
