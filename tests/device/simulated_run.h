#pragma once
// A multi-rank run of a plan on the recording fake device (recording_device.h): for every
// rank, the CUDA engine's set-up (runtime/cuda/device_session.h), iterations of the real
// CUDA executor over the real model wiring (RecordingBackend), and the teardown, each
// rank's calls in its own log. The channel agreement, which needs MPI, is made from every
// rank's programs as each rank would compute it; communicator names carry their members'
// world ranks so that logs of different ranks can be compared.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_executor.h"
#include "runtime/cuda/device_streams.h"
#include "runtime/train/gradient_reduction.h"
#include "tests/device/recording_device.h"

namespace dhelix::cuda::testing {

/// What one simulated rank asked of its device, and what it counted.
struct RankRecord {
  int64_t rank = 0;
  std::vector<DeviceCall> calls;
  int64_t own_streams = 0;      ///< DeviceStreams::count().own
  int64_t library_streams = 0;  ///< DeviceStreams::count().library
  int64_t communicators = 0;
  std::optional<AttentionDecision> attention;  ///< the set-up's attention decision
  /// With a SimulatedReduction: the reducer's buckets, and per bucket the last instruction
  /// of the program run that writes one of its gradients (rt::bucket_last_writers).
  std::vector<rt::ReductionBucket> buckets;
  std::vector<int64_t> last_writers;
  int64_t parameter_elements = 0;  ///< of every parameter of the rank the reducer sums
};

/// The gradient reduction of a simulated run, as the CUDA engine's update() runs it
/// (runtime/cuda/device_gradient_reducer.h): each iteration is followed by a marker
/// "update <k>", the reducer's finish() and AdamW ("adamw" kernels on compute, or the
/// distributed optimizer's step and gathers).
struct SimulatedReduction {
  int64_t bucket_elements = 40'000'000;  ///< --ddp-bucket-size
  bool overlap = false;                  ///< --overlap-grad-reduce
  bool sharded = false;                  ///< --distributed-optimizer
  bool overlap_gather = false;           ///< --overlap-param-gather
  /// Mark "done <i>" in the log right after instruction i is enqueued (and before the
  /// reducer's hook runs).
  bool mark_instructions = false;
};

/// Called on every rank right before each execute_device_program: a test's faults
/// (RecordingDevice::stick_stream, ...) and executor options (the watchdog's timeout).
using BeforeExecute =
    std::function<void(int64_t rank, RecordingDevice& device, DeviceStreams& streams,
                       DeviceCommDirectory& comms, DeviceExecutionOptions& options)>;

/// Runs `iterations` iterations of every rank's program of `mode` (and sets up for both
/// modes, as dhelix-run does), with CUDA_DEVICE_MAX_CONNECTIONS = `max_connections`; with
/// `reduction`, the gradients are reduced as it says (set up before "activations laid
/// out", which then marks the end of the set-up).
std::vector<RankRecord> simulate_run(const Plan& plan, const JobSpec& job, ExecutionMode mode,
                                     int64_t iterations, const std::string& max_connections = "32",
                                     std::optional<SimulatedReduction> reduction = std::nullopt,
                                     BeforeExecute before_execute = nullptr);

}  // namespace dhelix::cuda::testing
