#include "runtime/train/cpu_engine.h"

#include <chrono>
#include <utility>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/finite_check.h"
#include "runtime/train/rank_comms.h"

namespace dhelix::rt {

namespace {

class CpuEngine final : public TrainingEngine {
 public:
  CpuEngine(const JobSpec& job, int64_t rank, const ModelSlice& slice)
      : model_(job, rank, slice.layer_ranges, slice.embedding, slice.head, slice.seed),
        adamw_(model_.parameters()) {}

  void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) override {
    comms_ = std::make_unique<RankComms>(groups);
    model_.plan_activation_memory(programs);
  }

  void start_iteration(std::vector<MicroBatchTokens> micro_batches, float loss_scale) override {
    micro_batches_ = static_cast<int64_t>(micro_batches.size());
    model_.start_iteration(micro_batches_);
    model_.set_loss_scale(loss_scale);
    for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
      model_.set_tokens(static_cast<int64_t>(mb), std::move(micro_batches[mb]));
    }
  }

  double execute(const Plan& plan, const RankProgram& program, ExecutionOptions options) override {
    DHELIX_CHECK(comms_ != nullptr);
    return execute_program(plan, program, model_, *comms_, std::move(options)).wall_us;
  }

  std::vector<float> micro_batch_losses() override { return model_.micro_batch_losses(); }

  float moe_aux_loss_sum() override { return model_.moe_aux_loss_sum(micro_batches_); }

  IterationSnapshot snapshot() override { return take_snapshot(model_); }

  bool gradients_finite() override {
    for (const ParameterView& p : model_.parameters()) {
      if (kernels::count_non_finite(p.gradient, p.count) > 0) return false;
    }
    return true;
  }

  void update(int64_t t, const AdamWSettings& settings) override {
    const std::vector<ParameterView> params = model_.parameters();
    synchronise_gradients(params, comms_->main_group(ParallelDim::kTp), comms_->gradient_group(),
                          &comms_->main_expert_data_parallel());
    sync_end_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    adamw_.step(params, t, settings);
  }

  int64_t last_sync_end_ns() const override { return sync_end_ns_; }

  MemoryReport memory_report() override {
    MemoryReport report;
    // The master weights are what the CPU's ops read: no compute copies.
    for (const ParameterView& p : model_.parameters()) {
      report.weight_bytes += p.count * static_cast<int64_t>(sizeof(float));
      report.gradient_bytes += p.count * static_cast<int64_t>(sizeof(float));
      report.optimizer_bytes += 2 * p.count * static_cast<int64_t>(sizeof(float));
    }
    report.activation_element_bytes = sizeof(float);
    model_.fill_memory_report(report);
    return report;
  }

  std::vector<NamedTensor> state() override {
    std::vector<NamedTensor> tensors;
    const std::vector<ParameterView> params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const float* values = params[i].values;
      tensors.push_back({params[i].name, {values, values + params[i].count}});
      tensors.push_back({"adam_m/" + params[i].name, adamw_.first_moment(i)});
      tensors.push_back({"adam_v/" + params[i].name, adamw_.second_moment(i)});
    }
    return tensors;
  }

  void restore(const RankShard& shard) override {
    const std::vector<ParameterView> params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t count = params[i].count;
      shard.copy_into(params[i].name, params[i].values, count);
      shard.copy_into("adam_m/" + params[i].name, adamw_.first_moment(i).data(), count);
      shard.copy_into("adam_v/" + params[i].name, adamw_.second_moment(i).data(), count);
    }
  }

 private:
  StageModel model_;
  AdamW adamw_;
  std::unique_ptr<RankComms> comms_;
  int64_t sync_end_ns_ = 0;
  int64_t micro_batches_ = 0;
};

}  // namespace

EngineFactory cpu_engine_factory(int blas_threads) {
  return [blas_threads](const JobSpec& job, int64_t rank, const ModelSlice& slice) {
    cpu::set_blas_threads(blas_threads);
    return std::unique_ptr<TrainingEngine>(std::make_unique<CpuEngine>(job, rank, slice));
  };
}

}  // namespace dhelix::rt
