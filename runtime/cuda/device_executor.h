#pragma once
// The CUDA executor: runs one rank's program (lib/plan/rank_program.h) for one training
// iteration on the rank's CUDA streams, the GPU twin of the CPU interpreter
// (runtime/exec/interpreter.h), with the same semantics:
//   1. every instruction is bound to the model first (model.bind allocates its buffers,
//      and the communicator each one uses is looked up), so no allocation and no lookup
//      happens while work is enqueued; the host then waits for the device (binding's
//      allocations and zeroing run on the pool's stream; options.synchronize_after_binding)
//      and options.after_binding runs (e.g. to forbid the device pool to grow during the
//      iteration);
//   2. every pipeline receive is posted on its channel stream, in the sender's order
//      (device_schedule.h);
//   3. the lowering's ops are walked in program order: each op's stream waits on its
//      events, the op is enqueued (compute: the model's closure with that stream's Exec;
//      collective: the model's before_collective step, the NCCL call on the communicator
//      of (group, stream), then the model's after_collective step, all on that stream; send:
//      ncclSend on the channel to the peer; receive: a wait on the posted receive's event), then
//      its event is recorded; options.before_instruction and after_instruction run around
//      each (the gradient reduction's hooks, device_gradient_reducer.h);
//      while it enqueues, a watchdog thread polls every NCCL communicator of the
//      iteration (enqueue_watchdog.h): an asynchronous error, or enqueueing that takes
//      longer than options.timeout_s, aborts the communicators (which returns a host stuck
//      in an NCCL call) and fails naming the instruction being enqueued;
//   4. every stream is joined into the compute stream and the host waits for it, polling
//      every NCCL communicator the iteration used for asynchronous errors, up to
//      options.timeout_s; past it the error names every busy stream with where it is (on
//      or before the first of its instructions whose recorded event has not fired, after
//      the last that has: only instructions another stream waits on record one), the last
//      instruction enqueued on it, and the communicators of that stream with their last
//      operation.
// The host never waits inside the iteration. Every CUDA and NCCL call goes through
// DeviceApi (device_api.h), so the tests run this executor on a recording fake. Sequential mode
// runs every op on the compute stream in program order (receives are still posted on the channel
// streams, as the CPU posts them first, so that a send never waits for its receiver's compute
// stream).
//
// Errors from binding or enqueueing name the rank, plan position and op as the CPU
// interpreter does ("<describe_instruction>: <error>"). Any failure after work was
// enqueued calls options.on_failure before it is thrown: the work left on the streams (an
// NCCL operation waiting for a peer) may never finish, so the caller ends the job.

#include <cstdint>
#include <functional>

#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/device_comms.h"
#include "runtime/cuda/device_model.h"
#include "runtime/cuda/device_streams.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/exec/stream.h"

namespace dhelix::cuda {

/// One execution's figures.
struct DeviceExecutionStats {
  /// From the iteration's start on the compute stream to the end of every stream's work,
  /// microseconds (cudaEventElapsedTime: about 0.5 us resolution).
  double wall_us = 0;
  int64_t instructions = 0;
  int64_t events = 0;  ///< events recorded (lowering, receives and joins)
  int64_t waits = 0;   ///< cudaStreamWaitEvent calls
};

struct DeviceExecutionOptions {
  /// Runs once every instruction is bound, before any work is enqueued.
  std::function<void()> after_binding;
  /// Called with the first failure that happens after work was enqueued.
  rt::FailureHandler on_failure;
  /// How long the host enqueues, and then waits for the iteration's end, before it
  /// declares the rank hung (dhelix-run --watchdog-s), seconds.
  double timeout_s = kDefaultWatchdogSeconds;
  /// How often the enqueue watchdog polls the communicators, seconds.
  double poll_period_s = 0.01;
  /// Before each instruction, hold its stream for a pseudo-random 0..jitter_us
  /// microseconds (runtime/exec/jitter.h; the same sequence as the CPU interpreter's).
  int64_t jitter_us = 0;
  uint64_t jitter_seed = 0;
  /// Called for instruction `index` (of the program) once its stream waits on its events,
  /// before it is enqueued there: a wait on the gather of the weights it reads
  /// (device_gradient_reducer.h, the overlapped parameter gather).
  std::function<void(size_t index, StreamHandle stream)> before_instruction;
  /// Called for instruction `index` once it is enqueued on `stream` and its event recorded:
  /// the reduction of the gradient buckets it finished (device_gradient_reducer.h).
  std::function<void(size_t index, StreamHandle stream)> after_instruction;
  /// Whether the host waits for the whole device once the program is bound (step 1 of the
  /// file comment). Off where another stream's work must go on across the iteration's
  /// start (the overlapped parameter gathers); after_binding then waits for what binding
  /// enqueued.
  bool synchronize_after_binding = true;
};

/// Runs `program` (lowered from `plan` for this rank) on `model`, with the communicators of
/// `comms` on the streams of `streams` (which must have a channel stream for every rank the
/// program receives from). The model must have its tokens set and start_iteration()
/// called. Returns once every stream has finished; throws the first failure.
DeviceExecutionStats execute_device_program(DeviceApi& api, const Plan& plan,
                                            const RankProgram& program, DeviceModel& model,
                                            DeviceCommDirectory& comms, DeviceStreams& streams,
                                            DeviceExecutionOptions options = {});

}  // namespace dhelix::cuda
