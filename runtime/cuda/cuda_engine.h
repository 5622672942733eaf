#pragma once
// The CUDA backend's training engine (runtime/train/training_engine.h):
//   * the rank's GPU: its index on the node (runtime/cuda/device_choice.h);
//   * the model slice on the CUDA backend (runtime/cuda/cuda_stage_model.h): bf16
//     activations, fp32 master weights and gradients in a DevicePool of its own stream;
//   * connect(): the rank's streams (runtime/cuda/device_streams.h) and NCCL
//     communicators (runtime/cuda/device_comms.h): TP collectives on every stream that
//     runs them, DP on the compute stream, and one channel per pipeline neighbour;
//   * execute(): the device executor (runtime/cuda/device_executor.h);
//   * update(): gradient sums with NCCL on the compute stream (TP for the norm gains under
//     sequence parallelism, then DP), then AdamW on the device, which also rewrites the
//     bf16 copies the GEMMs read. One host wait at the end, through the communicators'
//     watchdog.
// Host copies (snapshots for --verify, checkpoints) are made between iterations only.

#include "runtime/train/training_engine.h"

namespace dhelix::rt {

/// The CUDA engine's factory. Making an engine throws Error(kUnsupported) when the rank
/// finds no GPU of its own.
EngineFactory cuda_engine_factory();

}  // namespace dhelix::rt
