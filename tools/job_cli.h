#pragma once
// Command-line options shared by the tools that take a job: a job file and/or flags that
// override it (Megatron-LM's long names are accepted as aliases, so a Megatron launch line
// can be pasted), and loading them into one validated JobSpec.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lib/job_spec.h"

namespace dhelix {

/// The job as given on the command line. Unset optionals leave the job file's value.
struct JobOptions {
  std::string job_file;    ///< positional JOB; "" when the job comes from flags only
  std::string model_file;  ///< --model
  std::string cluster;     ///< --cluster: preset name or cluster file
  std::optional<int64_t> dp, tp, cp, pp, ep;
  std::optional<bool> sp;
  std::optional<int64_t> micro_batch_size, global_batch_size, seq_length;
  std::optional<std::string> rank_order;
  // ----- activation recompute and uneven pipeline stages (Megatron's flag names) -----
  std::optional<std::string> recompute_granularity;  ///< --recompute-granularity
  std::optional<std::string> recompute_method;       ///< --recompute-method
  std::optional<int64_t> recompute_num_layers;       ///< --recompute-num-layers
  std::optional<int64_t> first_stage_layers;         ///< --decoder-first-pipeline-num-layers
  std::optional<int64_t> last_stage_layers;          ///< --decoder-last-pipeline-num-layers
  bool account_for_embedding = false;                ///< --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;                     ///< --account-for-loss-in-pipeline-split
  // cost-model settings
  std::optional<int64_t> expert_tp;            ///< --expert-tensor-parallel-size
  std::optional<double> moe_load_imbalance;    ///< --moe-load-imbalance
  std::optional<bool> overlap_grad_reduce;     ///< --overlap-grad-reduce / --no-...
  std::optional<bool> overlap_param_gather;    ///< --overlap-param-gather / --no-...
  bool grad_reduce_in_bf16 = false;            ///< --grad-reduce-in-bf16
  std::optional<std::string> cp_comm_type;     ///< --cp-comm-type p2p|a2a|allgather|a2a+p2p
  std::vector<int64_t> hierarchical_cp_sizes;  ///< --hierarchical-context-parallel-sizes A P
  // fully sharded data parallelism
  bool use_megatron_fsdp = false;                  ///< --use-megatron-fsdp
  std::optional<std::string> fsdp_sharding;        ///< --data-parallel-sharding-strategy
  std::optional<bool> fsdp_reshard_after_forward;  ///< --fsdp-reshard-after-forward / --no-...
};

/// Adds JOB, --model, --cluster, --dp/--tp/--pp/--cp/--ep, --sp/--no-sp, --mbs, --gbs,
/// --seq, --rank-order, the recompute and uneven-stage flags and their Megatron-LM aliases to
/// `app`, writing into `options`.
void add_job_options(CLI::App& app, JobOptions& options);

/// Reads the job file (if any), applies the flags over it, and validates the result.
/// Without a job file, --model, --cluster, --gbs and --seq are required. Throws one Error
/// listing every problem (exit status per its code).
JobSpec load_job(const JobOptions& options);

/// load_job without the validation: what `dhelix-plan --search` starts from, since the
/// parallel sizes it searches replace the job's.
JobSpec load_unvalidated_job(const JobOptions& options);

/// Files the job was read from (job, model, cluster files; presets have none), for
/// provenance.
std::vector<std::string> job_input_files(const JobSpec& job);

}  // namespace dhelix
