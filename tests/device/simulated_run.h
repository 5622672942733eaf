#pragma once
// A multi-rank run of a plan on the recording fake device (recording_device.h): for every
// rank, the CUDA engine's set-up (runtime/cuda/device_session.h), iterations of the real
// CUDA executor over the real model wiring (RecordingBackend), and the teardown, each
// rank's calls in its own log. The channel agreement, which needs MPI, is made from every
// rank's programs as each rank would compute it; communicator names carry their members'
// world ranks so that logs of different ranks can be compared.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
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
};

/// Runs `iterations` iterations of every rank's program of `mode` (and sets up for both
/// modes, as dhelix-run does), with CUDA_DEVICE_MAX_CONNECTIONS = `max_connections`.
std::vector<RankRecord> simulate_run(const Plan& plan, const JobSpec& job, ExecutionMode mode,
                                     int64_t iterations, const std::string& max_connections = "32");

}  // namespace dhelix::cuda::testing
