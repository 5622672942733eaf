#pragma once
// dhelix-run --trace FILE: every rank's measured timeline as a Chrome trace (Trace Event
// Format), in the structure of dhelix-plan --trace (emitter/chrome_trace.h), so that the
// predicted and the measured iteration open side by side in Perfetto:
//
//   process "stage S rank R" (pid R)  thread "tasks" (tid 0): one slice per task and step,
//                                       from its first op's start to its last op's end
//                                     "compute" (1), "local comm" (2), "cross comm" (3):
//                                       one slice per instruction (name: the op id; cat:
//                                       its strand "fwd"/"bwd", or "extra"), preceded by a
//                                       "wait" slice (cat "wait") where the stream reached
//                                       it before its cross-stream waits were over
//                                     "receive" (4): pipeline receives, each slice the wait
//                                       for its message
//                                     "step" (5): "iteration" (the program's execution),
//                                       "dp_reduction" (the gradient sums over tp and dp,
//                                       or the wait for them where they overlapped the
//                                       backward) and "optimizer" (AdamW) of each step
//                                     "dp buckets" (6): one "dp_bucket" slice (cat
//                                       "dp_bucket", args step and bucket) per gradient
//                                       bucket's reduction (gradient_reduction.h), and
//                                       with the distributed optimizer a
//                                       "dp_param_gather" per bucket: the previous step's
//                                       weights, gathered during this step when
//                                       overlapped (the last step's are not traced)
//                                     counter "memory" ("ph": "C", per process): the
//                                       activation bytes live over each step, args
//                                       {"activation_bytes": N}, one event per change
//                                       (memory_timeline.h)
//
// Slices carry "args": step, instruction, task label, micro_batch, layer, block, group. A
// sequential run (--sequential) has every instruction on the compute thread (it runs there).
//
// Metadata ("otherData"): job, schema_version, num_micro_batches, plan_identity, measured
// (true), schedule, ranks, steps, hosts, clock, and "memory": per rank, in rank order, its
// measured memory in exact bytes (memory_record.h, memory_record_json): {rank, stage,
// weight_bytes, gradient_bytes, optimizer_bytes, activation_arena_bytes,
// activation_live_peak_bytes, activation_element_bytes, weight_bytes_per_parameter,
// gradient_bytes_per_parameter, optimizer_bytes_per_parameter, optimizer_shards, buffers}:
// what dhelix-diff --measured compares with the plan's stage memory.
//
// Clock: steady_clock (CLOCK_MONOTONIC), one per host. Before the first step the ranks pass
// a barrier and each reads its clock; every rank's times are relative to the reading of the
// lowest rank on the same host, so ranks sharing a host share one clock exactly and hosts
// are aligned to within the barrier's exit skew. Times are microseconds, 3 decimals.
//
// Cost: two clock readings per instruction into a preallocated slot (about 50 ns, against
// ops of tens of microseconds or more); gathering and writing happen after the last step.
// Rank 0 gathers every rank's readings (MPI_Gatherv), lowers every rank's program itself to
// name the instructions, and writes the file atomically (lib/atomic_file.h).

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/exec/interpreter.h"
#include "runtime/train/gradient_reduction.h"
#include "runtime/train/memory_record.h"

namespace dhelix::rt {

/// One traced step of one rank, steady_clock nanoseconds.
struct StepRecord {
  int64_t step = 0;  ///< 0-based
  int64_t iteration_start_ns = 0;
  int64_t iteration_end_ns = 0;
  int64_t update_start_ns = 0;
  int64_t sync_end_ns = 0;  ///< gradient sums done, optimizer starts (0: not known)
  int64_t update_end_ns = 0;
  std::vector<OpTiming> ops;          ///< by instruction index
  std::vector<BucketTiming> buckets;  ///< the gradient buckets' reductions
};

/// A rank's measured timeline over the steps of one run.
class RunTrace {
 public:
  /// Collective over MPI_COMM_WORLD: a barrier, then each rank reads its clock.
  RunTrace(ExecutionMode mode, int64_t rank);

  /// The record the next step fills (valid until the next call).
  StepRecord& add_step(int64_t step);

  /// Every rank's memory (gather_rank_memory's answer; read on rank 0 only): the "memory"
  /// counter tracks and otherData.memory. Without it the trace has neither.
  void set_memory(std::vector<RankMemory> ranks) { memory_ = std::move(ranks); }
  /// The emulated links the run used (LinkEmulation::to_json()): otherData.link_emulation.
  void set_link_emulation(OrderedJson links) { link_emulation_ = std::move(links); }

  /// Collective over MPI_COMM_WORLD: rank 0 gathers every rank's records and writes the
  /// trace to `path` atomically (Error(kIo) naming the path when it cannot).
  void write(const std::string& path, const Plan& plan, const JobSpec& job) const;

 private:
  ExecutionMode mode_;
  int64_t rank_ = 0;
  int64_t origin_ns_ = 0;
  std::vector<StepRecord> steps_;
  std::vector<RankMemory> memory_;
  OrderedJson link_emulation_;  // null: the real transport
};

}  // namespace dhelix::rt
