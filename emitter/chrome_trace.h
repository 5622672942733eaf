#pragma once
// The predicted iteration of a plan as a Chrome trace (Trace Event Format, JSON), loadable in
// Perfetto (ui.perfetto.dev) and chrome://tracing.
//
//   process "stage N" (pid N)   thread "tasks" (tid 0): one slice per task, named by its label,
//                               then the exposed DP reduction, the optimizer step and the
//                               exposed parameter gather (the plan's stage phases), so that
//                               the slowest stage's row ends at the predicted iteration time
//                               thread "compute" (tid 1), "local comm" (2), "cross comm" (3):
//                               the task's ops (emitter/task_expansion.h), named by op id
//                               thread "<link>: pipeline sends" (4): one slice per task whose
//                               result another stage waits for, the sender's p2p time long
//                               thread "<link>: DP reduction" (5): the whole gradient
//                               reduction (hidden, then exposed) and parameter gather
//   flow arrows "p2p"           from each task to the task of another stage that waits for it
//
// <link> is "cross comm" or "local comm", by where the group's ranks are. A plan written
// before the stage phases existed (format 1.0) gets neither the phases nor rows 4 and 5.
//
// Times are microseconds (the format's unit), rounded to 3 decimals. Slices carry "args":
// task label, micro-batch, layer, strand, SI block (its number in the template, as the
// report and the pairing picture number it, and which template), and "approximate" for ops laid out
// from solo times. Colours ("cname", chrome://tracing's reserved names) follow the strand:
// forward ops green, backward ops orange, extra steps grey; task slices by kind.
//
// The baselines (megatron-1f1b, wavelet+, intra-batch) are not drawn: a plan keeps only their
// figures, not their timelines. Their iteration times go to the trace's "otherData".
//
// The output is deterministic: events in (stage, task, op) order, flow ids counted in that
// order, keys in a fixed order.

#include <cstdint>
#include <string>

#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// What a trace holds.
struct TraceOptions {
  /// Expand every task into its ops; false: task slices only (a trace a tenth the size).
  bool expand_ops = true;
  /// Keep only tasks whose micro-batches are all below this (-1: every task): a short trace of
  /// the warm-up for a plan with hundreds of micro-batches.
  int64_t micro_batch_limit = -1;
};

/// The trace object {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
/// Throws what expand_task throws.
OrderedJson chrome_trace(const Plan& plan, const TraceOptions& options);

/// chrome_trace as text, one event per line (small diffs, greppable).
std::string chrome_trace_text(const Plan& plan, const TraceOptions& options);

/// Writes chrome_trace_text(plan, {}) to `path` atomically; Error(kIo) naming the path.
void write_trace_file(const Plan& plan, const std::string& path);

}  // namespace dhelix
