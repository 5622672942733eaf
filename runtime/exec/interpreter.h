#pragma once
// The plan interpreter: executes one rank's program (lib/plan/rank_program.h) for one training
// iteration on the model slice the rank holds (runtime/model/stage_model.h).
//
// Every instruction is first bound to the model on the calling thread (buffers allocated,
// closures made, communicators looked up: the bind step shared with the CUDA executor,
// runtime/exec/bind.h), every pipeline receive is posted, and only then does work start:
//   * co-executed mode: each instruction goes to the stream the plan names (compute,
//     local_comm, cross_comm; receives to a receive stream; runtime/exec/stream.h) and
//     waits for exactly the events the CUDA executor waits for (the stream lowering,
//     runtime/exec/stream_lowering.h): the plan's DAG edges, block barriers and transfers
//     that stream order and earlier waits do not already imply. The calling thread does
//     nothing but wait for the end.
//   * sequential mode: the calling thread runs the instructions one by one in program
//     order, each collective to its end before the next op: the reference schedule of
//     dhelix-run --verify.
// Collectives of a communication stream use that stream's communicators, so two streams
// never share one (an MPI communicator must not run two collectives at once).
//
// A failing instruction stops the rank: the error names the rank, the plan position and the
// op (describe_instruction), and the other streams skip what is left.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/comm/communicator.h"
#include "runtime/exec/stream.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// Where the interpreter finds its communicators. `stream` is compute (the calling thread,
/// sequential mode), local_comm or cross_comm; each stream gets communicators
/// of its own. `dim` is a parallel dimension (tp, cp, dp, pp).
class CommunicatorDirectory {
 public:
  virtual ~CommunicatorDirectory() = default;
  /// The group of dimension `dim` that holds this rank, for use by `stream`.
  virtual Communicator& group(ParallelDim dim, StreamClass stream) = 0;
  /// A communicator over every rank, for pipeline transfers by `stream`.
  virtual Communicator& point_to_point(StreamClass stream) = 0;
  /// cp_comm_type a2a+p2p: the CP sub-group of `level` (the all-to-alls' or the ring's);
  /// by default the whole CP group (no sub-groups).
  virtual Communicator& cp_level(Placement::CpLevel level, StreamClass stream) {
    (void)level;
    return group(ParallelDim::kCp, stream);
  }
};

/// How long each stream was busy in one execution, microseconds of wall time.
struct ExecutionStats {
  double wall_us = 0;
  double compute_busy_us = 0;
  double local_comm_busy_us = 0;
  double cross_comm_busy_us = 0;
  double receive_wait_us = 0;  ///< time the receive stream waited for pipeline messages
  int64_t instructions = 0;
};

/// One instruction's measured times, steady_clock nanoseconds (dhelix-run --trace).
struct OpTiming {
  int64_t ready_ns = 0;  ///< its stream reached it, before its cross-stream waits
  int64_t start_ns = 0;  ///< its work started (after the waits and any jitter)
  int64_t end_ns = 0;
};

/// How to execute, besides the program's own mode.
struct ExecutionOptions {
  /// Before each instruction, sleep a pseudo-random 0..jitter_us microseconds
  /// (runtime/exec/jitter.h).
  int64_t jitter_us = 0;
  uint64_t jitter_seed = 0;
  /// Called with the first failure (runtime/exec/stream.h), e.g. to abort the job.
  FailureHandler on_failure;
  /// >= 0: the CPU the compute stream's thread (sequential mode: the calling thread, for
  /// the execution only) is pinned to (runtime/exec/affinity.h).
  int compute_cpu = -1;
  /// Non-null: resized to the program's length and filled with each instruction's times.
  /// Reading the clock twice per op costs well under 1 % of an op of the tiny models.
  std::vector<OpTiming>* timings = nullptr;
  /// Non-empty: called with an instruction's index once its work has finished, on the
  /// thread that ran it (never for one that failed or was skipped): how the overlapped
  /// gradient reduction learns that a bucket's last writer has run
  /// (runtime/train/gradient_reduction.h). Must be quick and must not throw.
  std::function<void(size_t)> on_instruction_done = nullptr;
  /// Non-empty: called with an instruction's index before its work starts, on the thread
  /// that runs it; may block (the distributed optimizer's parameter gathers the
  /// instruction reads, runtime/train/gradient_reduction.h). Must not throw.
  std::function<void(size_t)> before_instruction = nullptr;
};

/// Runs `program` (lowered from `plan` for this rank) on `model`. The model must have its
/// micro-batches' tokens set and start_iteration() called. Throws the first failure.
ExecutionStats execute_program(const Plan& plan, const RankProgram& program, StageModel& model,
                               CommunicatorDirectory& comms, ExecutionOptions options = {});

}  // namespace dhelix::rt
