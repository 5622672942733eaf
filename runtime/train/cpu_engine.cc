#include "runtime/train/cpu_engine.h"

#include <chrono>
#include <utility>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/exec/stream_lowering.h"
#include "runtime/kernels/finite_check.h"
#include "runtime/train/gradient_reduction.h"
#include "runtime/train/rank_comms.h"
#include "runtime/train/sharded_adamw.h"

namespace dhelix::rt {

namespace {

class CpuEngine final : public TrainingEngine {
 public:
  CpuEngine(const JobSpec& job, int64_t rank, const ModelSlice& slice,
            const CpuEngineOptions& options)
      : model_(job, rank, slice.layer_ranges, slice.embedding, slice.head, slice.seed),
        distributed_(options.distributed_optimizer.value_or(slice.distributed_optimizer)),
        bucket_elements_(options.ddp_bucket_elements),
        overlap_(options.overlap_grad_reduce.value_or(job.parallel.overlap_grad_reduce)),
        overlap_gather_(options.overlap_param_gather.value_or(job.parallel.overlap_param_gather)),
        experts_apart_(job.parallel.ep > 1) {
    if (!distributed_) adamw_ = std::make_unique<AdamW>(model_.parameters());
  }

  // The buckets follow the first program (the plan's co-executed one): the order in which
  // its instructions finish the gradients (gradient_reduction.h).
  void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) override {
    comms_ = std::make_unique<RankComms>(groups);
    model_.plan_activation_memory(programs, program_orders(programs));
    const std::vector<ParameterView> params = model_.parameters();
    reducer_ = std::make_unique<GradientReducer>(
        params,
        reduction_buckets_of(params, programs.empty() ? nullptr : programs.front(),
                             bucket_elements_, experts_apart_),
        ReductionGroups{.tp = &groups.reduction_tp(),
                        .dense = &groups.reduction_gradient_group(),
                        .expert = &groups.reduction_expert_data_parallel()},
        distributed_);
    if (distributed_) sharded_ = std::make_unique<ShardedAdamW>(params, *reducer_);
  }

  void start_iteration(std::vector<MicroBatchTokens> micro_batches, float loss_scale) override {
    reducer_->wait_for_started();  // the last execution's buckets, before the zeroing
    micro_batches_ = static_cast<int64_t>(micro_batches.size());
    model_.start_iteration(micro_batches_);
    model_.set_loss_scale(loss_scale);
    for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
      model_.set_tokens(static_cast<int64_t>(mb), std::move(micro_batches[mb]));
    }
  }

  double execute(const Plan& plan, const RankProgram& program, ExecutionOptions options) override {
    DHELIX_CHECK(comms_ != nullptr);
    options.on_instruction_done = reducer_->start(program, overlap_, options.on_failure);
    options.before_instruction = reducer_->gather_waits(program);
    return execute_program(plan, program, model_, *comms_, std::move(options)).wall_us;
  }

  std::vector<float> micro_batch_losses() override { return model_.micro_batch_losses(); }

  float moe_aux_loss_sum() override { return model_.moe_aux_loss_sum(micro_batches_); }

  // With overlap the gradients leave execute() being summed (all-reduced in place; with the
  // distributed optimizer the local ones stay, but the TP sums are in place): both read
  // them once the started buckets are done.
  IterationSnapshot snapshot() override {
    reducer_->wait_for_started();
    return take_snapshot(model_);
  }

  bool gradients_finite() override {
    reducer_->wait_for_started();
    for (const ParameterView& p : model_.parameters()) {
      if (kernels::count_non_finite(p.gradient, p.count) > 0) return false;
    }
    return true;
  }

  void update(int64_t t, const AdamWSettings& settings) override {
    const std::vector<ParameterView> params = model_.parameters();
    reducer_->finish();
    last_timings_ = reducer_->timings();  // before the step starts the next gathers
    sync_end_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    if (sharded_) {
      sharded_->step(t, settings, overlap_gather_);
    } else {
      adamw_->step(params, t, settings);
    }
  }

  int64_t last_sync_end_ns() const override { return sync_end_ns_; }

  std::vector<BucketTiming> last_bucket_timings() const override { return last_timings_; }

  MemoryReport memory_report() override {
    MemoryReport report;
    // The master weights are what the CPU's ops read: no compute copies.
    for (const ParameterView& p : model_.parameters()) {
      report.weight_bytes += p.count * static_cast<int64_t>(sizeof(float));
      report.gradient_bytes += p.count * static_cast<int64_t>(sizeof(float));
      if (!sharded_) report.optimizer_bytes += 2 * p.count * static_cast<int64_t>(sizeof(float));
    }
    if (sharded_) {
      // This rank's shards, padding included (gradient_reduction.h); the dense buckets'
      // group is what the states are split over (the experts' is the expert-data-parallel
      // group: docs/runtime.md, "Data-parallel gradient reduction").
      report.optimizer_bytes =
          2 * sharded_->shard_elements_held() * static_cast<int64_t>(sizeof(float));
      report.optimizer_shards = reducer_->dense_group_size();
      report.expert_optimizer_bytes =
          2 * sharded_->shard_elements_held(true) * static_cast<int64_t>(sizeof(float));
      report.expert_optimizer_shards = reducer_->expert_group_size();
    }
    report.activation_element_bytes = sizeof(float);
    model_.fill_memory_report(report);
    return report;
  }

  std::vector<NamedTensor> state() override {
    std::vector<NamedTensor> tensors;
    const std::vector<ParameterView> params = model_.parameters();
    // The distributed optimizer's moments are gathered whole: checkpoints keep one format.
    std::vector<std::vector<float>> first, second;
    if (sharded_) {
      reducer_->wait_for_gathers();  // the weights, whole
      sharded_->gather_moments(first, second);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const float* values = params[i].values;
      tensors.push_back({params[i].name, {values, values + params[i].count}});
      tensors.push_back(
          {"adam_m/" + params[i].name, sharded_ ? first[i] : adamw_->first_moment(i)});
      tensors.push_back(
          {"adam_v/" + params[i].name, sharded_ ? second[i] : adamw_->second_moment(i)});
    }
    return tensors;
  }

  void restore(const RankShard& shard) override {
    const std::vector<ParameterView> params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t count = params[i].count;
      shard.copy_into(params[i].name, params[i].values, count);
      if (sharded_) {
        std::vector<float> first(static_cast<size_t>(count)), second(first.size());
        shard.copy_into("adam_m/" + params[i].name, first.data(), count);
        shard.copy_into("adam_v/" + params[i].name, second.data(), count);
        sharded_->restore_moments(i, first.data(), second.data());
        continue;
      }
      shard.copy_into("adam_m/" + params[i].name, adamw_->first_moment(i).data(), count);
      shard.copy_into("adam_v/" + params[i].name, adamw_->second_moment(i).data(), count);
    }
  }

 private:
  StageModel model_;
  bool distributed_;              // the distributed optimizer (sharded_adamw.h)
  std::unique_ptr<AdamW> adamw_;  // without it
  std::unique_ptr<RankComms> comms_;
  int64_t bucket_elements_;
  bool overlap_;
  bool overlap_gather_;  // the distributed optimizer's weights gathered under the forward
  bool experts_apart_;
  // The reducer runs the optimizer's gathers: destroyed first (it finishes them), before
  // the optimizer, the communicators and the model it uses.
  std::unique_ptr<ShardedAdamW> sharded_;  // with the distributed optimizer
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<BucketTiming> last_timings_;
  int64_t sync_end_ns_ = 0;
  int64_t micro_batches_ = 0;
};

}  // namespace

EngineFactory cpu_engine_factory(CpuEngineOptions options) {
  return [options](const JobSpec& job, int64_t rank, const ModelSlice& slice) {
    cpu::set_blas_threads(options.blas_threads);
    return std::unique_ptr<TrainingEngine>(std::make_unique<CpuEngine>(job, rank, slice, options));
  };
}

}  // namespace dhelix::rt
