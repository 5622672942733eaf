#include "runtime/cuda/cuda_engine.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_stage_model.h"
#include "runtime/cuda/device_choice.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_executor.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/cuda/device_streams.h"
#include "runtime/cuda/kernels_cuda.h"

namespace dhelix::rt {
namespace {

using CudaParameterView = CudaStageModel::ParameterView;

// Selects the rank's GPU before anything else touches CUDA. Without a launcher's local
// rank the world rank stands in: the ranks may not talk to each other yet
// (runtime/cuda/device_choice.h).
int select_device(int64_t rank) {
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
      cuda::local_rank_from_environment([](const char* name) { return std::getenv(name); });
  const int device = cuda::choose_device(rank, local >= 0 ? local : rank, count,
                                         std::getenv("CUDA_VISIBLE_DEVICES"));
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

class CudaEngine final : public TrainingEngine {
 public:
  CudaEngine(const JobSpec& job, int64_t rank, const ModelSlice& slice)
      : rank_(rank),
        device_(select_device(rank)),
        pool_(std::make_unique<cuda::DevicePool>(pool_stream_.get())),
        model_(std::make_unique<CudaStageModel>(job, rank, slice.layer_ranges, slice.embedding,
                                                slice.head, slice.seed,
                                                CudaBackend::MemoryConfig{pool_.get()})),
        num_layers_(job.model.num_layers),
        tp_(job.parallel.tp),
        dp_(job.parallel.dp) {
    for (const CudaParameterView& p : model_->parameters()) {
      moments_.push_back(
          {pool_->allocate_array<float>(p.count), pool_->allocate_array<float>(p.count)});
      DHELIX_CUDA(cudaMemsetAsync(moments_.back().first, 0, bytes(p.count), pool_stream_.get()));
      DHELIX_CUDA(cudaMemsetAsync(moments_.back().second, 0, bytes(p.count), pool_stream_.get()));
    }
    DHELIX_CUDA(cudaStreamSynchronize(pool_stream_.get()));
  }

  ~CudaEngine() override {
    // Nothing may still run on buffers about to go back to the pool.
    static_cast<void>(cudaDeviceSynchronize());
  }

  void connect(ProcessGroups& groups, const std::vector<const RankProgram*>& programs) override {
    cuda::DeviceCommSetup setup;
    // TP on every stream that runs the model's collectives (compute: sequential programs
    // and the norm gains' gradient sum); DP only for the gradient sum on compute.
    setup.collectives = {{ParallelDim::kTp, cuda::DeviceStream::kCompute},
                         {ParallelDim::kTp, cuda::DeviceStream::kLocalComm},
                         {ParallelDim::kTp, cuda::DeviceStream::kCrossComm},
                         {ParallelDim::kDp, cuda::DeviceStream::kCompute}};
    setup.num_layers = num_layers_;
    setup.options.world_rank = rank_;
    comms_ = std::make_unique<cuda::DeviceCommDirectory>(groups, programs, setup);
    streams_ = std::make_unique<cuda::DeviceStreams>(comms_->receive_peers());
  }

  void start_iteration(std::vector<MicroBatchTokens> micro_batches, float loss_scale) override {
    pool_->set_growth_allowed(true);
    model_->start_iteration(static_cast<int64_t>(micro_batches.size()));
    model_->set_loss_scale(loss_scale);
    for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
      model_->set_tokens(static_cast<int64_t>(mb), std::move(micro_batches[mb]));
    }
  }

  double execute(const Plan& plan, const RankProgram& program, ExecutionOptions options) override {
    DHELIX_CHECK(comms_ != nullptr && streams_ != nullptr);
    cuda::DeviceExecutionOptions device_options;
    // Binding allocates every buffer of the iteration; growing inside it would stall all
    // streams on a cudaMalloc (runtime/cuda/device_pool.h).
    device_options.after_binding = [this] {
      DHELIX_CUDA(cudaStreamSynchronize(pool_stream_.get()));  // zeroed buffers ready
      pool_->set_growth_allowed(false);
    };
    device_options.on_failure = std::move(options.on_failure);
    device_options.jitter_us = options.jitter_us;
    device_options.jitter_seed = options.jitter_seed;
    return cuda::execute_device_program(plan, program, *model_, *comms_, *streams_,
                                        std::move(device_options))
        .wall_us;
  }

  std::vector<float> micro_batch_losses() override { return model_->micro_batch_losses(); }

  IterationSnapshot snapshot() override {
    IterationSnapshot snapshot;
    snapshot.losses = model_->micro_batch_losses();
    for (const CudaParameterView& p : model_->parameters()) {
      snapshot.names.push_back(p.name);
      snapshot.gradients.push_back(download(p.gradient, p.count));
    }
    return snapshot;
  }

  void update(int64_t t, const AdamWSettings& settings) override {
    const cudaStream_t stream = streams_->stream(cuda::DeviceStream::kCompute);
    const std::vector<CudaParameterView> params = model_->parameters();
    cuda::DeviceCommunicator* last_used = nullptr;
    for (const CudaParameterView& p : params) {
      if (p.sum_gradient_over_tp && tp_ > 1) {
        last_used = &comms_->group("tp", cuda::DeviceStream::kCompute);
        last_used->all_reduce_sum(p.gradient, p.count, cuda::DeviceDtype::kFloat32, stream);
      }
      if (dp_ > 1) {
        last_used = &comms_->group("dp", cuda::DeviceStream::kCompute);
        last_used->all_reduce_sum(p.gradient, p.count, cuda::DeviceDtype::kFloat32, stream);
      }
    }
    const kernels::AdamWStep step = kernels::make_adamw_step(
        t, settings.lr, settings.beta1, settings.beta2, settings.eps, settings.weight_decay);
    for (size_t i = 0; i < params.size(); ++i) {
      const CudaParameterView& p = params[i];
      cuda::adamw_update(step, p.count, p.gradient, p.values, moments_[i].first, moments_[i].second,
                         p.compute, stream);
    }
    // The one host wait of the update; through a communicator when NCCL ran, so that an
    // asynchronous NCCL error or a hung peer is reported instead of waited for forever.
    if (last_used != nullptr) {
      last_used->wait(stream);
    } else {
      DHELIX_CUDA(cudaStreamSynchronize(stream));
    }
  }

  std::vector<NamedTensor> state() override {
    std::vector<NamedTensor> tensors;
    const std::vector<CudaParameterView> params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const CudaParameterView& p = params[i];
      tensors.push_back({p.name, download(p.values, p.count)});
      tensors.push_back({"adam_m/" + p.name, download(moments_[i].first, p.count)});
      tensors.push_back({"adam_v/" + p.name, download(moments_[i].second, p.count)});
    }
    return tensors;
  }

  void restore(const RankShard& shard) override {
    const std::vector<CudaParameterView> params = model_->parameters();
    std::vector<float> host;
    for (size_t i = 0; i < params.size(); ++i) {
      const CudaParameterView& p = params[i];
      host.resize(static_cast<size_t>(p.count));
      for (const auto& [name, device] :
           {std::pair{p.name, p.values}, std::pair{"adam_m/" + p.name, moments_[i].first},
            std::pair{"adam_v/" + p.name, moments_[i].second}}) {
        shard.copy_into(name, host.data(), p.count);
        DHELIX_CUDA(cudaMemcpy(device, host.data(), bytes(p.count), cudaMemcpyHostToDevice));
      }
    }
    model_->refresh_compute_copies();
  }

 private:
  static size_t bytes(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }

  std::vector<float> download(const float* device, int64_t count) const {
    std::vector<float> host(static_cast<size_t>(count));
    DHELIX_CUDA(cudaMemcpy(host.data(), device, bytes(count), cudaMemcpyDeviceToHost));
    return host;
  }

  int64_t rank_;
  int device_;
  PoolStream pool_stream_;
  std::unique_ptr<cuda::DevicePool> pool_;
  std::unique_ptr<CudaStageModel> model_;
  std::vector<Moments> moments_;
  int64_t num_layers_;
  int64_t tp_;
  int64_t dp_;
  std::unique_ptr<cuda::DeviceCommDirectory> comms_;
  std::unique_ptr<cuda::DeviceStreams> streams_;
};

}  // namespace

EngineFactory cuda_engine_factory() {
  return [](const JobSpec& job, int64_t rank, const ModelSlice& slice) {
    return std::unique_ptr<TrainingEngine>(std::make_unique<CudaEngine>(job, rank, slice));
  };
}

}  // namespace dhelix::rt
