#include "runtime/train/cpu_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/exec/stream_lowering.h"
#include "runtime/kernels/finite_check.h"
#include "runtime/train/fsdp_checkpoint.h"
#include "runtime/train/gradient_reduction.h"
#include "runtime/train/rank_comms.h"
#include "runtime/train/sharded_adamw.h"

namespace dhelix::rt {

namespace {

class CpuEngine final : public TrainingEngine {
 public:
  CpuEngine(const JobSpec& job, int64_t rank, const ModelSlice& slice,
            const CpuEngineOptions& options)
      : model_(job, rank, slice.layer_ranges, slice.embedding, slice.head, slice.seed, {},
               slice.fsdp),
        distributed_(options.distributed_optimizer.value_or(slice.distributed_optimizer)),
        bucket_elements_(options.ddp_bucket_elements),
        overlap_(options.overlap_grad_reduce.value_or(job.parallel.overlap_grad_reduce)),
        overlap_gather_(options.overlap_param_gather.value_or(job.parallel.overlap_param_gather)),
        experts_apart_(job.parallel.ep > 1),
        dp_coordinate_(Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).dp) {
    if (!distributed_) adamw_ = std::make_unique<AdamW>(reduced_parameters());
    // FSDP shards: each rank's AdamW moments of its own shard, from the gradient the plan's
    // reduce-scatters summed (runtime/model/fsdp_layers.h).
    const std::vector<ParameterView> shards = fsdp_shards();
    if (!shards.empty()) fsdp_adamw_ = std::make_unique<AdamW>(shards);
  }

  // The buckets follow the first program (the plan's co-executed one): the order in which
  // its instructions finish the gradients (gradient_reduction.h).
  void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) override {
    comms_ = std::make_unique<RankComms>(groups);
    model_.plan_activation_memory(programs, program_orders(programs));
    if (fsdp_adamw_) {
      fsdp_group_ = &groups.group(ParallelDim::kDp, CommSlot::kMain);
      // The model sharded by DP coordinate; the gathers concatenate in group-rank order.
      if (fsdp_group_->rank() != dp_coordinate_) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("FSDP: DP coordinate {} is rank {} of its DP communicator",
                                dp_coordinate_, fsdp_group_->rank()));
      }
      // Under SP the norm gains' shards are summed over TP (sum_fsdp_gains_over_tp).
      fsdp_tp_ = &groups.group(ParallelDim::kTp, CommSlot::kMain);
    }
    // The FSDP shards' gradients are summed by the plan's reduce-scatters: the reduction
    // and the distributed optimizer take the other parameters only.
    const std::vector<ParameterView> params = reduced_parameters();
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
    const double wall_us =
        execute_program(plan, program, model_, *comms_, std::move(options)).wall_us;
    model_.finish_iteration();  // FSDP: the reduced shards, summed in micro-batch order
    sum_fsdp_gains_over_tp();
    return wall_us;
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
    reducer_->finish();
    last_timings_ = reducer_->timings();  // before the step starts the next gathers
    sync_end_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    if (sharded_) {
      sharded_->step(t, settings, overlap_gather_);
    } else {
      adamw_->step(reduced_parameters(), t, settings);
    }
    if (fsdp_adamw_) fsdp_adamw_->step(fsdp_shards(), t, settings);
  }

  int64_t last_sync_end_ns() const override { return sync_end_ns_; }

  std::vector<BucketTiming> last_bucket_timings() const override { return last_timings_; }

  MemoryReport memory_report() override {
    MemoryReport report;
    // The master weights are what the CPU's ops read: no compute copies.
    for (const ParameterView& p : model_.parameters()) {
      report.weight_bytes += p.count * static_cast<int64_t>(sizeof(float));
      report.gradient_bytes += p.count * static_cast<int64_t>(sizeof(float));
      if (!sharded_ || p.fsdp_shard) {
        report.optimizer_bytes += 2 * p.count * static_cast<int64_t>(sizeof(float));
      }
    }
    if (sharded_) {
      // This rank's shards, padding included (gradient_reduction.h); the dense buckets'
      // group is what the states are split over (the experts' is the expert-data-parallel
      // group: docs/runtime.md, "Data-parallel gradient reduction").
      report.optimizer_bytes +=
          2 * sharded_->shard_elements_held() * static_cast<int64_t>(sizeof(float));
      report.optimizer_shards = reducer_->dense_group_size();
      report.expert_optimizer_bytes =
          2 * sharded_->shard_elements_held(true) * static_cast<int64_t>(sizeof(float));
      report.expert_optimizer_shards = reducer_->expert_group_size();
    }
    // FSDP: each micro-batch's reduced gradient shard (the whole weights and gradients are
    // in the activation arena, below).
    report.gradient_bytes += model_.fsdp_reduced_elements() * static_cast<int64_t>(sizeof(float));
    report.activation_element_bytes = sizeof(float);
    model_.fill_memory_report(report);
    return report;
  }

  std::vector<NamedTensor> state() override {
    std::vector<NamedTensor> tensors;
    // The distributed optimizer's moments are gathered whole: checkpoints keep one format.
    std::vector<std::vector<float>> first, second;
    if (sharded_) {
      reducer_->wait_for_gathers();  // the weights, whole
      sharded_->gather_moments(first, second);
    }
    size_t reduced = 0, shard = 0;  // indices into the reduction's and the shards' lists
    for (const ParameterView& p : model_.parameters()) {
      if (p.fsdp_shard) {
        add_gathered_shard(tensors, p, shard++);
        continue;
      }
      const size_t i = reduced++;
      tensors.push_back({p.name, {p.values, p.values + p.count}});
      tensors.push_back({"adam_m/" + p.name, sharded_ ? first[i] : adamw_->first_moment(i)});
      tensors.push_back({"adam_v/" + p.name, sharded_ ? second[i] : adamw_->second_moment(i)});
    }
    return tensors;
  }

  void restore(const RankShard& shard) override {
    size_t reduced = 0, shards = 0;
    for (const ParameterView& p : model_.parameters()) {
      if (p.fsdp_shard) {
        restore_shard(shard, p, shards++);
        continue;
      }
      const size_t i = reduced++;
      const int64_t count = p.count;
      shard.copy_into(p.name, p.values, count);
      if (sharded_) {
        std::vector<float> first(static_cast<size_t>(count)), second(first.size());
        shard.copy_into("adam_m/" + p.name, first.data(), count);
        shard.copy_into("adam_v/" + p.name, second.data(), count);
        sharded_->restore_moments(i, first.data(), second.data());
        continue;
      }
      shard.copy_into("adam_m/" + p.name, adamw_->first_moment(i).data(), count);
      shard.copy_into("adam_v/" + p.name, adamw_->second_moment(i).data(), count);
    }
  }

 private:
  std::vector<ParameterView> reduced_parameters() {
    std::vector<ParameterView> views;
    for (const ParameterView& p : model_.parameters()) {
      if (!p.fsdp_shard) views.push_back(p);
    }
    return views;
  }
  std::vector<ParameterView> fsdp_shards() {
    std::vector<ParameterView> views;
    for (const ParameterView& p : model_.parameters()) {
      if (p.fsdp_shard) views.push_back(p);
    }
    return views;
  }
  // FSDP under sequence parallelism: the norm gains' gradients are partial over TP (each
  // TP rank's sequence shard). They are summed here, on the shard after the DP
  // reduce-scatters and the micro-batch sum, not in the op that writes them before the
  // reduce-scatter: the TP peers' shards hold the same elements (fsdp_layout.h), so one
  // all-reduce per layer and iteration over the gains' part of the shard gives the sum
  // that per-micro-batch all-reduces of the whole gains would, with no collective in a
  // compute op (which the plan does not schedule) and in a fixed order on the main thread
  // (--verify stays bitwise). Against unsharded SP (micro-batches, then TP, then DP) the
  // additions are reassociated, as FSDP's DP sum already is: docs/kernels.md's tolerance.
  void sum_fsdp_gains_over_tp() {
    if (fsdp_tp_ == nullptr || fsdp_tp_->size() == 1) return;
    for (const ParameterView& p : fsdp_shards()) {
      for (const ShardRange& range : model_.fsdp_layout(p.name)->tp_summed_ranges(dp_coordinate_)) {
        fsdp_tp_->all_reduce_sum(p.gradient + range.begin, range.count);
      }
    }
  }
  // A layer's shard as a checkpoint keeps it: gathered whole over DP (fsdp_checkpoint.h).
  void add_gathered_shard(std::vector<NamedTensor>& tensors, const ParameterView& p, size_t index) {
    add_gathered_fsdp_shard(tensors, *model_.fsdp_layout(p.name), *fsdp_group_, p.values,
                            fsdp_adamw_->first_moment(index).data(),
                            fsdp_adamw_->second_moment(index).data());
  }
  // This rank's shard of the whole tensors a checkpoint holds.
  void restore_shard(const RankShard& shard, const ParameterView& p, size_t index) {
    const FsdpLayout& layout = *model_.fsdp_layout(p.name);
    const auto take = [&](const std::string& prefix, float* out) {
      const std::vector<float> mine =
          fsdp_shard_from_checkpoint(shard, layout, prefix, fsdp_group_->rank());
      std::copy(mine.begin(), mine.end(), out);
    };
    take("", p.values);
    take("adam_m/", fsdp_adamw_->first_moment(index).data());
    take("adam_v/", fsdp_adamw_->second_moment(index).data());
  }

  StageModel model_;
  bool distributed_;                    // the distributed optimizer (sharded_adamw.h)
  std::unique_ptr<AdamW> adamw_;        // without it
  std::unique_ptr<AdamW> fsdp_adamw_;   // the FSDP shards' (runtime/model/fsdp_layers.h)
  Communicator* fsdp_group_ = nullptr;  // their DP group, for the main thread
  Communicator* fsdp_tp_ = nullptr;     // their TP group (SP's gain sums), the main thread's
  std::unique_ptr<RankComms> comms_;
  int64_t bucket_elements_;
  bool overlap_;
  bool overlap_gather_;  // the distributed optimizer's weights gathered under the forward
  bool experts_apart_;
  int64_t dp_coordinate_ = 0;  // the FSDP shard the model holds
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
