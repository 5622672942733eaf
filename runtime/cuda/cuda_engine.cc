#include "runtime/cuda/cuda_engine.h"
#include "runtime/cuda/moe_cuda.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/placement.h"
#include "lib/rank_shape.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_device_api.h"
#include "runtime/cuda/cuda_environment.h"
#include "runtime/cuda/cuda_stage_model.h"
#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/device_choice.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_executor.h"
#include "runtime/cuda/device_gradient_reducer.h"
#include "runtime/cuda/device_model.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/cuda/device_session.h"
#include "runtime/cuda/device_setup.h"
#include "runtime/cuda/device_streams.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/exec/stream_lowering.h"
#include "runtime/train/fsdp_checkpoint.h"
#include "runtime/train/gradient_reduction.h"

namespace dhelix::cuda {
namespace {

using rt::AdamWSettings;
using rt::EngineFactory;
using rt::ExecutionOptions;
using rt::IterationSnapshot;
using rt::MemoryReport;
using rt::MicroBatchTokens;
using rt::ModelSlice;
using rt::NamedTensor;
using rt::ProcessGroups;
using rt::RankShard;
using rt::TrainingEngine;

using CudaParameterView = CudaStageModel::ParameterView;

// Selects the rank's GPU before anything else touches CUDA, after the environment CUDA
// reads when it starts (cuda_environment.h: dhelix-run prepared it before MPI_Init; an
// engine made elsewhere prepares it here, and a setting made too late is reported). Without
// a launcher's local rank the world rank stands in: the ranks may not talk to each other
// yet (runtime/cuda/device_choice.h).
int select_device(int64_t rank) {
  for (const std::string& note : late_setting_notes(process_cuda_environment())) {
    std::cerr << fmt::format("dhelix: warning: rank {}: {}\n", rank, note);
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count < 1) {
    // No driver or no device; CUDA's own words say which.
    throw Error(
        ErrorCode::kUnsupported,
        fmt::format("rank {}: --backend cuda: no CUDA device found (cudaGetDeviceCount: {})", rank,
                    cudaGetErrorString(status)));
  }
  const int64_t local =
      local_rank_from_environment([](const char* name) { return std::getenv(name); });
  const int device =
      choose_device(rank, local >= 0 ? local : rank, count, std::getenv("CUDA_VISIBLE_DEVICES"));
  DHELIX_CUDA(cudaSetDevice(device));
  return device;
}

// A stream of the engine's own for the device pool: allocation, zeroing, uploads and
// downloads happen between iterations, ordered apart from the executor's streams.
class PoolStream {
 public:
  PoolStream() { DHELIX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~PoolStream() { static_cast<void>(cudaStreamDestroy(stream_)); }
  PoolStream(const PoolStream&) = delete;
  PoolStream& operator=(const PoolStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The AdamW moments of one parameter, in device memory.
struct Moments {
  float* first = nullptr;
  float* second = nullptr;
};

cudaStream_t cuda_of(StreamHandle stream) { return reinterpret_cast<cudaStream_t>(stream); }

class CudaEngine final : public TrainingEngine {
 public:
  CudaEngine(const JobSpec& job, int64_t rank, const ModelSlice& slice, CudaEngineOptions options)
      : rank_(rank),
        options_(options),
        device_(select_device(rank)),
        api_(std::make_unique<CudaDeviceApi>()),
        pool_(std::make_unique<DevicePool>(pool_stream_.get())),
        model_(std::make_unique<CudaStageModel>(
            job, rank, slice.layer_ranges, slice.embedding, slice.head, slice.seed,
            CudaBackend::MemoryConfig{pool_.get()}, slice.fsdp)),
        num_layers_(job.model.num_layers),
        tp_(job.parallel.tp),
        dp_(job.parallel.dp),
        cp_(job.parallel.cp),
        ep_(job.parallel.ep),
        parallel_(job.parallel),
        gemm_shapes_(job_gemm_shapes(job, rank, !slice.layer_ranges.empty(), slice.head)),
        warmup_sizes_(comm_warmup_sizes(job, rank)),
        // Under CP the ring types run ring steps, not this attention; Ulysses runs it on
        // its head split (device_setup.h).
        has_layers_(!slice.layer_ranges.empty()),
        attention_(model_attention_setup(rank_shape(job, rank), has_layers_,
                                         job.parallel.cp_comm_type, options.deterministic,
                                         parse_attention_choice(std::getenv("DHELIX_ATTENTION")))),
        workspace_bytes_(workspace_bytes(job, rank_shape(job, rank))),
        overlap_(options.overlap_grad_reduce.value_or(job.parallel.overlap_grad_reduce)),
        // Over a DP x CP group of one there is nothing to shard: the whole state.
        sharded_(options.distributed_optimizer.value_or(slice.distributed_optimizer) &&
                 job.parallel.dp * job.parallel.cp > 1),
        overlap_gather_(sharded_ &&
                        options.overlap_param_gather.value_or(job.parallel.overlap_param_gather)),
        dp_coordinate_(Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).dp) {
    // The FSDP shards' moments, this rank's shard of each layer's (fsdp_layers.h); the
    // other parameters' here, or with the distributed optimizer the reducer's (connect()).
    for (const CudaParameterView& p : views(true)) fsdp_moments_.push_back(zeroed_moments(p.count));
    if (!sharded_) {
      for (const CudaParameterView& p : views(false)) moments_.push_back(zeroed_moments(p.count));
    }
    DHELIX_CUDA(cudaStreamSynchronize(pool_stream_.get()));
  }

  ~CudaEngine() override {
    // Nothing may still run on buffers about to go back to the pool.
    static_cast<void>(cudaDeviceSynchronize());
  }

  void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) override {
    DeviceCommSetup setup = model_comm_setup(parallel_);
    setup.num_layers = num_layers_;
    // The gradient groups are warmed at the reducer's largest buckets (make_reducer), the DP
    // communicators under FSDP at the largest gathered layer too.
    setup.warmup = warmup_sizes_;
    size_gradient_warmups(setup.warmup, buckets(programs.empty() ? nullptr : programs.front()));
    for (const CudaParameterView& p : views(true)) {
      setup.warmup.dp = std::max(setup.warmup.dp, p.count * dp_);
    }
    if (!fsdp_moments_.empty()) connect_fsdp(groups);
    setup.options.world_rank = rank_;
    setup.options.timeout_s = options_.watchdog_s;
    session_ = std::make_unique<DeviceSession>(
        *api_, setup, programs, gemm_shapes_, attention_,
        // What CUDA works with, not what the environment reads now (cuda_environment.h).
        value_in_effect(process_cuda_environment(), "CUDA_DEVICE_MAX_CONNECTIONS"),
        [&](DeviceApi& api, const DeviceCommSetup& comm_setup) {
          return DeviceCommDirectory::over_mpi(api, groups, programs, comm_setup);
        });
    streams_ = &session_->streams();
    comms_ = &session_->comms();
    const StreamHandle compute = streams_->stream(DeviceStream::kCompute);
    report_attention(session_->preparation().attention);
    CudnnSdpa* cudnn = api_->cudnn_attention();
    if (cudnn != nullptr) {
      workspace_bytes_ = std::max(workspace_bytes_, cudnn->workspace_bytes(attention_->shape));
    }
    workspace_ = pool_->allocate_array<char>(workspace_bytes_);
    model_->plan_activation_memory(programs, rt::program_orders(programs));
    finite_flag_ = pool_->allocate_array<int>(1);
    device_model_ = std::make_unique<StageModelOnDevice<CudaBackend>>(
        *model_, [this, compute](StreamHandle stream) {
          if (stream != compute) {
            return CudaBackend::Exec{.stream = cuda_of(stream), .gemm = nullptr, .workspace = {}};
          }
          return CudaBackend::Exec{.stream = cuda_of(stream),
                                   .gemm = &api_->gemm_for(stream),
                                   .workspace = {workspace_, workspace_bytes_},
                                   .cudnn = api_->cudnn_attention()};
        });
    make_reducer(programs.empty() ? nullptr : programs.front());
    DHELIX_CUDA(cudaDeviceSynchronize());
  }

  rt::MemoryReport memory_report() override {
    rt::MemoryReport report;
    // fp32 masters, bf16 compute copies, fp32 gradients and two fp32 AdamW moments.
    // An FSDP shard has no bf16 copy (its gathers make the layer's: in the activations).
    for (const CudaParameterView& p : model_->parameters()) {
      const int64_t copy = p.fsdp_shard ? 0 : static_cast<int64_t>(sizeof(uint16_t));
      report.weight_bytes += p.count * (static_cast<int64_t>(sizeof(float)) + copy);
      report.gradient_bytes += p.count * static_cast<int64_t>(sizeof(float));
      if (!sharded_ || p.fsdp_shard) {
        report.optimizer_bytes += 2 * p.count * static_cast<int64_t>(sizeof(float));
      }
    }
    // FSDP: each micro-batch's reduced gradient shard.
    report.gradient_bytes += model_->fsdp_reduced_elements() * static_cast<int64_t>(sizeof(float));
    if (sharded_) {
      // This rank's shards, padding included, as the CPU engine counts them.
      report.optimizer_bytes +=
          2 * reducer_->shard_elements_held() * static_cast<int64_t>(sizeof(float));
      report.optimizer_shards = reducer_->dense_group_size();
      report.expert_optimizer_bytes =
          2 * reducer_->shard_elements_held(true) * static_cast<int64_t>(sizeof(float));
      report.expert_optimizer_shards = reducer_->expert_group_size();
    }
    report.activation_element_bytes = 2;
    report.weight_bytes_per_parameter = sizeof(float) + sizeof(uint16_t);
    model_->fill_memory_report(report);
    return report;
  }

  void start_iteration(std::vector<MicroBatchTokens> micro_batches, float loss_scale) override {
    // The zeroing below must not overtake the last execution's reductions.
    if (reductions_pending_) synchronize_reductions();
    micro_batches_ = static_cast<int64_t>(micro_batches.size());
    pool_->set_growth_allowed(true);
    model_->start_iteration(static_cast<int64_t>(micro_batches.size()));
    model_->set_loss_scale(loss_scale);
    for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
      model_->set_tokens(static_cast<int64_t>(mb), std::move(micro_batches[mb]));
    }
  }

  double execute(const Plan& plan, const RankProgram& program, ExecutionOptions options) override {
    DHELIX_CHECK(comms_ != nullptr && streams_ != nullptr);
    DeviceExecutionOptions device_options;
    // Binding allocates every buffer of the iteration; growing inside it would stall all
    // streams on a cudaMalloc (runtime/cuda/device_pool.h).
    device_options.after_binding = [this] {
      DHELIX_CUDA(cudaStreamSynchronize(pool_stream_.get()));  // zeroed buffers ready
      pool_->set_growth_allowed(false);
    };
    DeviceGradientReducer::Hooks hooks = reducer_->start(program, overlap_);
    device_options.before_instruction = std::move(hooks.before_instruction);
    device_options.after_instruction = std::move(hooks.after_instruction);
    // The gathers of the last step go on across the iteration's start; after_binding waits
    // for the pool's stream, where binding's work is.
    device_options.synchronize_after_binding = !overlap_gather_;
    reductions_pending_ = overlap_;
    device_options.on_failure = std::move(options.on_failure);
    device_options.jitter_us = options.jitter_us;
    device_options.jitter_seed = options.jitter_seed;
    device_options.timeout_s = options_.watchdog_s;
    const double wall_us = execute_device_program(*api_, plan, program, *device_model_, *comms_,
                                                  *streams_, std::move(device_options))
                               .wall_us;
    // FSDP: the reduced shards, summed in micro-batch order on the compute stream; the
    // gains' TP sums wait for the reducer (sum_fsdp_gains_over_tp).
    model_->finish_iteration(
        CudaBackend::Exec{.stream = cuda_of(streams_->stream(DeviceStream::kCompute)),
                          .gemm = nullptr,
                          .workspace = {}});
    fsdp_tp_pending_ = true;
    return wall_us;
  }

  std::vector<float> micro_batch_losses() override { return model_->micro_batch_losses(); }
  // Downloads (after execute() waited for every stream): one float per layer and micro-batch.
  float moe_aux_loss_sum() override { return model_->moe_aux_loss_sum(micro_batches_); }

  // With overlap the gradients leave execute() being summed (in place; with the
  // distributed optimizer the local ones stay, the TP sums in place): read after the sums.
  IterationSnapshot snapshot() override {
    synchronize_reductions();
    sum_fsdp_gains_over_tp();
    IterationSnapshot snapshot;
    snapshot.losses = model_->micro_batch_losses();
    for (const CudaParameterView& p : model_->parameters()) {
      snapshot.names.push_back(p.name);
      snapshot.gradients.push_back(download(p.gradient, p.count));
    }
    return snapshot;
  }

  bool gradients_finite() override {
    synchronize_reductions();
    sum_fsdp_gains_over_tp();
    const cudaStream_t stream = cuda_of(streams_->stream(DeviceStream::kCompute));
    DHELIX_CUDA(cudaMemsetAsync(finite_flag_, 0, sizeof(int), stream));
    for (const CudaParameterView& p : model_->parameters()) {
      flag_non_finite(p.count, p.gradient, finite_flag_, stream);
    }
    int bad = 0;
    DHELIX_CUDA(cudaMemcpyAsync(&bad, finite_flag_, sizeof(int), cudaMemcpyDeviceToHost, stream));
    DHELIX_CUDA(cudaStreamSynchronize(stream));  // between iterations, as snapshot() was
    return bad == 0;
  }

  void update(int64_t t, const AdamWSettings& settings) override {
    const StreamHandle compute = streams_->stream(DeviceStream::kCompute);
    const cudaStream_t stream = cuda_of(compute);
    reducer_->finish();  // the compute stream waits for the sums
    reductions_pending_ = false;
    sum_fsdp_gains_over_tp();
    const kernels::AdamWStep step = kernels::make_adamw_step(
        t, settings.lr, settings.beta1, settings.beta2, settings.eps, settings.weight_decay);
    if (sharded_) {
      reducer_->step(step, overlap_gather_);
    } else {
      const std::vector<CudaParameterView> params = views(false);
      for (size_t i = 0; i < params.size(); ++i) {
        const CudaParameterView& p = params[i];
        adamw_update(step, p.count, p.gradient, p.values, moments_[i].first, moments_[i].second,
                     p.compute, stream);
      }
    }
    // FSDP: AdamW on this rank's shards (no bf16 copy: the next gathers convert).
    const std::vector<CudaParameterView> shards = views(true);
    for (size_t i = 0; i < shards.size(); ++i) {
      const CudaParameterView& p = shards[i];
      adamw_update(step, p.count, p.gradient, p.values, fsdp_moments_[i].first,
                   fsdp_moments_[i].second, nullptr, stream);
    }
    // The one host wait of the update (not for overlapped gathers: the compute stream
    // waited for the step only); through a communicator when NCCL ran, so that an
    // asynchronous NCCL error or a hung peer is reported instead of waited for forever.
    if (watchdog_ != nullptr) {
      watchdog_->wait(compute);
    } else {
      wait_for_step(compute);
    }
  }

  std::vector<NamedTensor> state() override {
    std::vector<NamedTensor> tensors;
    const std::vector<CudaParameterView> params = views(false);
    // The distributed optimizer's moments are gathered whole (collective over each
    // bucket's group): checkpoints keep one format.
    std::vector<std::vector<float>> first(params.size()), second(params.size());
    if (sharded_) {
      reducer_->synchronize();  // the weights, whole
      for (auto [moment, whole] : {std::pair{false, &first}, std::pair{true, &second}}) {
        reducer_->gather_moments(moment, [&, whole](size_t p, const float* device) {
          (*whole)[p] = download(device, params[p].count);
        });
      }
    }
    // In the model's order, the FSDP shards gathered whole where they stand (the CPU
    // engine's order: the same files).
    size_t reduced = 0, shard = 0;
    for (const CudaParameterView& p : model_->parameters()) {
      if (p.fsdp_shard) {
        const Moments& m = fsdp_moments_[shard++];
        rt::add_gathered_fsdp_shard(tensors, *model_->fsdp_layout(p.name), *fsdp_host_dp_,
                                    download(p.values, p.count).data(),
                                    download(m.first, p.count).data(),
                                    download(m.second, p.count).data());
        continue;
      }
      const size_t i = reduced++;
      tensors.push_back({p.name, download(p.values, p.count)});
      tensors.push_back(
          {"adam_m/" + p.name, sharded_ ? first[i] : download(moments_[i].first, p.count)});
      tensors.push_back(
          {"adam_v/" + p.name, sharded_ ? second[i] : download(moments_[i].second, p.count)});
    }
    return tensors;
  }

  void restore(const RankShard& shard) override {
    reducer_->synchronize();  // no gather still writing the weights
    std::vector<float> host;
    size_t reduced = 0, shards = 0;
    for (const CudaParameterView& p : model_->parameters()) {
      if (p.fsdp_shard) {
        const Moments& m = fsdp_moments_[shards++];
        const rt::FsdpLayout& layout = *model_->fsdp_layout(p.name);
        for (const auto& [prefix, device] : {std::pair<std::string, float*>{"", p.values},
                                             {"adam_m/", m.first},
                                             {"adam_v/", m.second}}) {
          host = rt::fsdp_shard_from_checkpoint(shard, layout, prefix, dp_coordinate_);
          upload(host.data(), device, p.count);
        }
        continue;
      }
      const size_t i = reduced++;
      host.resize(static_cast<size_t>(p.count));
      shard.copy_into(p.name, host.data(), p.count);
      upload(host.data(), p.values, p.count);
      for (const bool second : {false, true}) {
        shard.copy_into((second ? "adam_v/" : "adam_m/") + p.name, host.data(), p.count);
        if (!sharded_) {
          upload(host.data(), second ? moments_[i].second : moments_[i].first, p.count);
          continue;
        }
        // This rank's shard of the whole moments (the distributed optimizer).
        for (const DeviceGradientReducer::MomentPiece& piece : reducer_->moment_pieces(i)) {
          upload(host.data() + piece.offset, second ? piece.second : piece.first, piece.count);
        }
      }
    }
    model_->refresh_compute_copies();
  }

 private:
  static size_t bytes(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }

  // The model's parameters: the FSDP shards (`shards`) or the others, in the model's order.
  std::vector<CudaParameterView> views(bool shards) const {
    std::vector<CudaParameterView> out;
    for (const CudaParameterView& p : model_->parameters()) {
      if (p.fsdp_shard == shards) out.push_back(p);
    }
    return out;
  }

  Moments zeroed_moments(int64_t count) {
    Moments m{pool_->allocate_array<float>(count), pool_->allocate_array<float>(count)};
    DHELIX_CUDA(cudaMemsetAsync(m.first, 0, bytes(count), pool_stream_.get()));
    DHELIX_CUDA(cudaMemsetAsync(m.second, 0, bytes(count), pool_stream_.get()));
    return m;
  }

  // FSDP: the host's DP communicator for the checkpoints' gathers (fsdp_checkpoint.h),
  // whose rank must be the DP coordinate the model sharded by (the gathers concatenate in
  // group-rank order), as in the CPU engine.
  void connect_fsdp(ProcessGroups& groups) {
    fsdp_host_dp_ = &groups.group(ParallelDim::kDp, rt::CommSlot::kMain);
    if (fsdp_host_dp_->rank() != dp_coordinate_) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("FSDP: DP coordinate {} is rank {} of its DP communicator",
                              dp_coordinate_, fsdp_host_dp_->rank()));
    }
  }

  // FSDP under sequence parallelism: the norm gains' parts of the shards summed over TP, as
  // the CPU engine does and for its reasons (runtime/train/cpu_engine.cc), once per
  // iteration after the reducer's work (its TP sums run on the same communicator on the
  // reduction stream): on the compute stream, in the model's order.
  void sum_fsdp_gains_over_tp() {
    if (!fsdp_tp_pending_) return;
    fsdp_tp_pending_ = false;
    if (tp_ == 1) return;
    DeviceCommunicator& tp = comms_->group(ParallelDim::kTp, DeviceStream::kCompute);
    const StreamHandle compute = streams_->stream(DeviceStream::kCompute);
    for (const CudaParameterView& p : views(true)) {
      for (const rt::ShardRange& range :
           model_->fsdp_layout(p.name)->tp_summed_ranges(dp_coordinate_)) {
        tp.all_reduce_sum(p.gradient + range.begin, range.count, DeviceDtype::kFloat32, compute);
      }
    }
  }

  // The attention path, once per rank: rank 0 always, the others only when they fell back
  // (a cluster of thousands of ranks would otherwise print thousands of equal lines).
  void report_attention(const std::optional<AttentionDecision>& decision) const {
    if (!has_layers_) return;
    const bool fell_back = decision && decision->path == AttentionPath::kDhelix &&
                           attention_->choice != AttentionChoice::kDhelix &&
                           CudnnSdpa::built_with_cudnn();
    if (rank_ != 0 && !fell_back) return;
    for (const std::string& line : attention_summary(decision, cp_, parallel_.cp_comm_type)) {
      std::cerr << fmt::format("dhelix-run: rank {}: attention: {}\n", rank_, line);
    }
  }

  // update()'s host wait without a communicator to poll (a rank alone in every group): the
  // stream polled up to --watchdog-s, so that a stuck step is reported, not waited for.
  void wait_for_step(StreamHandle compute) const {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point since = Clock::now();
    while (!api_->stream_done(compute)) {
      if (std::chrono::duration<double>(Clock::now() - since).count() > options_.watchdog_s) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("rank {}: the optimizer step did not finish within {} s "
                                "(--watchdog-s); stream still busy: compute",
                                rank_, options_.watchdog_s));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // The compute stream's scratch: the column reductions of one op (kernels_cuda.h) and the
  // MoE router's tile counts and partials (moe_cuda.h), on at most max(rows, T) tokens.
  static int64_t workspace_bytes(const JobSpec& job, const RankShape& shape) {
    const int64_t rows = std::max(shape.rows, shape.tokens);
    int64_t bytes = std::max(column_reduction_workspace_bytes(rows, shape.hidden),
                             embedding_backward_workspace_bytes(shape.tokens));
    if (job.model.is_moe()) {
      bytes = std::max(
          bytes, moe_route_workspace_bytes(rows, job.model.moe->top_k, job.model.moe->num_experts));
    }
    return bytes;
  }

  // The gradient buckets, in the order `co_executed` finishes their gradients: the
  // reducer's, and the sizes the gradient groups are warmed at.
  std::vector<rt::ReductionBucket> buckets(const RankProgram* co_executed) const {
    std::vector<rt::BucketedParameter> shapes;
    for (const CudaParameterView& p : views(false)) shapes.push_back({p.name, p.count, p.expert});
    return rt::reduction_buckets_of(shapes, co_executed, options_.ddp_bucket_elements, ep_ > 1);
  }

  // The reducer over the rank's parameters, in the buckets of the first program (the
  // plan's co-executed one), its buffers from the pool, zeroed.
  void make_reducer(const RankProgram* co_executed) {
    // The FSDP shards' gradients are summed by the plan's reduce-scatters: the reducer
    // takes the other parameters only, over the gradient group apart from FSDP's.
    std::vector<DeviceParameter> params;
    const std::vector<CudaParameterView> views = this->views(false);
    for (const CudaParameterView& p : views) {
      params.push_back({p.name, p.values, p.gradient, p.count, p.sum_gradient_over_tp, p.expert});
    }
    DeviceReductionGroups groups;
    if (tp_ > 1) groups.tp = &comms_->group(ParallelDim::kTp, DeviceStream::kCompute);
    if (cp_ > 1 || (dp_ > 1 && parallel_.fsdp_shards_parameters())) {
      groups.dense = &comms_->gradient_group();
    } else if (dp_ > 1) {
      groups.dense = &comms_->group(ParallelDim::kDp, DeviceStream::kCompute);
    }
    if (ep_ > 1) groups.expert = &comms_->expert_gradient_group();
    watchdog_ = groups.dense != nullptr ? groups.dense : groups.expert ? groups.expert : groups.tp;
    const DeviceFloats allocate = [this](int64_t count) {
      float* buffer = pool_->allocate_array<float>(count);
      DHELIX_CUDA(cudaMemsetAsync(buffer, 0, bytes(count), pool_stream_.get()));
      return buffer;
    };
    DeviceOptimizerKernels kernels;
    if (sharded_) {
      kernels.adamw = [views](const kernels::AdamWStep& step, size_t p, int64_t offset,
                              int64_t count, const float* gradient, float* first, float* second,
                              StreamHandle stream) {
        adamw_update(step, count, gradient, views[p].values + offset, first, second,
                     views[p].compute + offset, cuda_of(stream));
      };
      kernels.refresh = [views](size_t p, StreamHandle stream) {
        convert_to_bf16(views[p].count, views[p].values, views[p].compute, cuda_of(stream));
      };
    }
    reducer_ = std::make_unique<DeviceGradientReducer>(
        *api_, std::move(params), buckets(co_executed), groups,
        streams_->stream(DeviceStream::kCompute), streams_->reduction_stream(), sharded_, allocate,
        std::move(kernels));
    DHELIX_CUDA(cudaStreamSynchronize(pool_stream_.get()));
  }

  // A host wait for the reduction stream: the gradients are summed (or the weights
  // gathered) and may be read or zeroed.
  void synchronize_reductions() {
    reducer_->synchronize();
    reductions_pending_ = false;
  }

  void upload(const float* host, float* device, int64_t count) const {
    DHELIX_CUDA(cudaMemcpy(device, host, bytes(count), cudaMemcpyHostToDevice));
  }

  std::vector<float> download(const float* device, int64_t count) const {
    std::vector<float> host(static_cast<size_t>(count));
    DHELIX_CUDA(cudaMemcpy(host.data(), device, bytes(count), cudaMemcpyDeviceToHost));
    return host;
  }

  int64_t rank_;
  CudaEngineOptions options_;
  int device_;
  std::unique_ptr<CudaDeviceApi> api_;
  PoolStream pool_stream_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<CudaStageModel> model_;
  std::vector<Moments> moments_;       // the other parameters' (without the distributed optimizer)
  std::vector<Moments> fsdp_moments_;  // the FSDP shards'
  int64_t num_layers_;
  int64_t tp_;
  int64_t dp_;
  int64_t cp_;
  int64_t ep_;
  int64_t micro_batches_ = 0;  // of the current iteration
  ParallelSpec parallel_;
  std::vector<GemmShape> gemm_shapes_;
  CommWarmupSizes warmup_sizes_;  // the NCCL warm-up's sizes (comm_warmup.h)
  bool has_layers_;
  std::optional<AttentionSetup> attention_;
  int64_t workspace_bytes_;
  char* workspace_ = nullptr;
  int* finite_flag_ = nullptr;                // gradients_finite()'s one flag
  bool overlap_;                              // --overlap-grad-reduce
  bool sharded_;                              // the distributed optimizer
  bool overlap_gather_;                       // its gathers under the next forward
  bool reductions_pending_ = false;           // an overlapped execution's sums not waited for yet
  int64_t dp_coordinate_ = 0;                 // the FSDP shard the model holds
  bool fsdp_tp_pending_ = false;              // this iteration's gains not yet summed over TP
  rt::Communicator* fsdp_host_dp_ = nullptr;  // checkpoints' gathers of the FSDP shards
  // Destroyed first (reverse order): the executor's view, then the session (the
  // communicators in their agreed order, then the streams); the API (and its cuBLAS
  // handles) outlives them.
  std::unique_ptr<DeviceSession> session_;
  DeviceStreams* streams_ = nullptr;
  DeviceCommDirectory* comms_ = nullptr;
  std::unique_ptr<DeviceModel> device_model_;
  // Destroyed before the session: its events, and the streams and communicators it uses.
  std::unique_ptr<DeviceGradientReducer> reducer_;
  DeviceCommunicator* watchdog_ = nullptr;  // the communicator update()'s host wait polls
};

}  // namespace

EngineFactory cuda_engine_factory(CudaEngineOptions options) {
  return [options](const JobSpec& job, int64_t rank, const ModelSlice& slice) {
    return std::unique_ptr<TrainingEngine>(std::make_unique<CudaEngine>(job, rank, slice, options));
  };
}

}  // namespace dhelix::cuda
