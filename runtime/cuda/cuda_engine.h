#pragma once
// The CUDA backend's training engine (runtime/train/training_engine.h):
//   * the rank's GPU: its index on the node (runtime/cuda/device_choice.h);
//   * the model slice on the CUDA backend (runtime/cuda/cuda_stage_model.h): bf16
//     activations, fp32 master weights and gradients in a DevicePool of its own stream;
//   * connect(), everything before the first receive of iteration 1 (device_setup.h):
//     the rank's streams, counted with NCCL's own against the hardware queues
//     (device_streams.h); every kernel loaded, the stack limit set and each GEMM shape run
//     once (device_setup.h); the NCCL communicators created (device_comms.h): TP
//     collectives on every stream that runs them, DP on the compute stream when dp > 1,
//     and one channel per pipeline neighbour; each warmed with every operation it runs, at
//     every size class (comm_warmup.h);
//   * execute(): the device executor (runtime/cuda/device_executor.h);
//   * the gradient sums (device_gradient_reducer.h): TP for the norm gains under sequence
//     parallelism, then DP in the CPU engine's buckets on a reduction stream of their own,
//     each bucket as soon as the backward has finished it (--overlap-grad-reduce) or all
//     after the iteration; with the distributed optimizer reduce-scattered, AdamW on this
//     rank's shards and the weights all-gathered (under the next forward with
//     --overlap-param-gather);
//   * update(): waits for the sums on the compute stream, then AdamW on the device (which
//     also rewrites the bf16 copies the GEMMs read), or the distributed optimizer's step.
//     One host wait at the end, through the communicators' watchdog.
// Every host wait for the device gives up after options.watchdog_s (dhelix-run
// --watchdog-s) and names what is busy.
// All CUDA, NCCL and cuBLAS calls of the set-up and the executor go through one
// CudaDeviceApi (cuda_device_api.h). CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS
// are set (when unset) before MPI_Init by dhelix-run (cuda_environment.h); the engine reports
// a setting made after CUDA had started and checks the streams against the value in effect.
// Host copies (snapshots for --verify, checkpoints) are made between iterations only.

#include <cstdint>
#include <optional>

#include "runtime/cuda/nccl_communicator.h"
#include "runtime/train/training_engine.h"

namespace dhelix::cuda {

/// What dhelix-run's flags set in the CUDA engine.
struct CudaEngineOptions {
  /// Elements per data-parallel gradient bucket (--ddp-bucket-size; gradient_buckets.h).
  int64_t ddp_bucket_elements = 40'000'000;
  /// --verify: attention must give the same bits every run (attention_path.h: cuDNN only
  /// with a deterministic backward that proved repeatable, else dhelix's kernel).
  bool deterministic = false;
  /// --overlap-grad-reduce / --no-...; unset: the job's parallel.overlap_grad_reduce.
  std::optional<bool> overlap_grad_reduce;
  /// --distributed-optimizer / --no-...; unset: the plan's options.distributed_optimizer.
  std::optional<bool> distributed_optimizer;
  /// --overlap-param-gather / --no-...; unset: the job's parallel.overlap_param_gather.
  std::optional<bool> overlap_param_gather;
  /// --watchdog-s: how long any host wait for the device (the warm-up, an iteration's
  /// enqueueing and its end, the update) may take before the rank reports what is busy and
  /// fails (device_executor.h, enqueue_watchdog.h, nccl_communicator.h).
  double watchdog_s = kDefaultWatchdogSeconds;
};

/// The CUDA engine's factory. Making an engine throws Error(kUnsupported) when the rank
/// finds no GPU of its own.
rt::EngineFactory cuda_engine_factory(CudaEngineOptions options = {});

}  // namespace dhelix::cuda
