#include "tools/job_cli.h"

#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/text.h"

namespace dhelix {
namespace {

constexpr const char* kFlags = "<flags>";

// A size flag's text as an integer. CLI11's own conversion clamps out-of-range values to
// INT64_MAX, so a later message would show a number the user never typed; this one
// repeats what was typed.
int64_t parse_size_flag(const std::string& flag, const std::string& text) {
  const std::string_view digits =
      text.starts_with('+') ? std::string_view(text).substr(1) : std::string_view(text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error == std::errc::result_out_of_range) {
    throw CLI::ValidationError(
        flag, fmt::format("{} is too {}", text, text.starts_with('-') ? "small" : "large"));
  }
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) {
    throw CLI::ValidationError(flag, fmt::format("\"{}\" is not an integer", text));
  }
  return value;
}

// `names` starts with the short flag ("--tp,--tensor-model-parallel-size"): messages name it.
void add_size_option(CLI::App& app, const std::string& names, std::optional<int64_t>& target,
                     const std::string& help) {
  const std::string flag = names.substr(0, names.find(','));
  app.add_option_function<std::string>(
         names, [&target, flag](const std::string& text) { target = parse_size_flag(flag, text); },
         help)
      ->type_name("N");
}

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
  add_size_option(app, "--recompute-num-layers", options.recompute_num_layers,
                  "Layers per recompute group (uniform) or recomputed per chunk (block)");
  add_size_option(app, "--decoder-first-pipeline-num-layers", options.first_stage_layers,
                  "Transformer layers on the first pipeline stage (uneven stages)");
  add_size_option(app, "--decoder-last-pipeline-num-layers", options.last_stage_layers,
                  "Transformer layers on the last pipeline stage (uneven stages)");
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
  add_size_option(app, "--dp,--data-parallel-size", options.dp, "Data-parallel size");
  add_size_option(app, "--tp,--tensor-model-parallel-size", options.tp, "Tensor-parallel size");
  add_size_option(app, "--pp,--pipeline-model-parallel-size", options.pp, "Pipeline stages");
  add_size_option(app, "--cp,--context-parallel-size", options.cp, "Context-parallel size");
  add_size_option(app, "--ep,--expert-model-parallel-size", options.ep, "Expert-parallel size");
  // Two flags that exclude each other: `--sp --no-sp` is an error, not "the last one wins".
  CLI::Option* sp_on = app.add_flag_callback(
      "--sp,--sequence-parallel", [&options] { options.sp = true; }, "Sequence parallelism on");
  CLI::Option* sp_off = app.add_flag_callback(
      "--no-sp", [&options] { options.sp = false; }, "Sequence parallelism off");
  sp_on->excludes(sp_off);
  add_size_option(app, "--mbs,--micro-batch-size", options.micro_batch_size,
                  "Sequences per micro-batch per data-parallel replica");
  add_size_option(app, "--gbs,--global-batch-size", options.global_batch_size,
                  "Sequences per iteration over all replicas");
  add_size_option(app, "--seq,--seq-length", options.seq_length, "Tokens per sequence");
  app.add_option_function<std::string>(
         "--rank-order", [&options](const std::string& value) { options.rank_order = value; },
         "Rank order, fastest first (default tp-cp-ep-dp-pp)")
      ->type_name("ORDER");
  add_recompute_and_stage_options(app, options);
  // cost-model settings
  add_size_option(app, "--expert-tensor-parallel-size", options.expert_tp,
                  "TP ranks each expert is split over (default: --tp, as Megatron-Core)");
  app.add_option_function<double>(
         "--moe-load-imbalance", [&options](double value) { options.moe_load_imbalance = value; },
         "Busiest expert's tokens over the mean (default 1.72, docs/cost-model.md)")
      ->type_name("X");
  app.add_flag_function(
      "--overlap-grad-reduce,!--no-overlap-grad-reduce",
      [&options](int64_t count) { options.overlap_grad_reduce = count > 0; },
      "DP gradient reduction under the backward (default on; --no-...: exposed)");
  app.add_flag_function(
      "--overlap-param-gather,!--no-overlap-param-gather",
      [&options](int64_t count) { options.overlap_param_gather = count > 0; },
      "DP parameter all-gather under the forward (default on; --no-...: exposed)");
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
