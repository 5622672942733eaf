#pragma once
// The activation bytes live over one traced step of a rank: dhelix-run --trace's "memory"
// counter track (run_trace.h), derived from the arena's buffers (runtime/memory/
// memory_report.h) and the step's measured instruction times (OpTiming).
//
// A buffer is live from the start of its first instruction to the end of its last; a
// buffer with first/last -1 (tokens, received messages, losses) for the whole iteration.
// The samples are the live bytes after every change, one per distinct time, from the
// iteration's start (the whole-iteration buffers and those whose first instruction starts
// then) to its end (0: nothing of the iteration is live after it).
//
// Worked case (tests/runtime/memory_timeline_test.cc): iteration 0..100 ns, instructions
// 0 (10..20) and 1 (30..40); buffer A 8 bytes on instructions 0..1, B 4 bytes on 1..1, C
// 2 bytes for the whole iteration: samples (0, 2), (10, 10), (30, 14), (40, 2), (100, 0).
//
// Buffer lifetimes are instruction indices of the co-executed rank program; a sequential
// trace (dhelix-run --sequential) ran the same instructions in another order, so its
// timings are first mapped onto the co-executed indices (instruction_map), and a buffer
// is live from the earlier start to the later end of its two instructions there.

#include <cstdint>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/exec/interpreter.h"
#include "runtime/memory/memory_report.h"

namespace dhelix::rt {

/// The activation bytes live from `time_ns` on (steady_clock ns, as OpTiming).
struct MemorySample {
  int64_t time_ns = 0;
  int64_t bytes = 0;
  bool operator==(const MemorySample&) const = default;
};

/// For each instruction of `reference` (the co-executed program), the index of the same
/// instruction in `traced` (equal kind, op, layer, micro-batch, task, direction and tag,
/// the n-th such for the n-th); empty when the programs do not hold the same instructions.
std::vector<int64_t> instruction_map(const RankProgram& reference, const RankProgram& traced);

/// The samples of one step (file comment). `ops` are the step's timings by traced index;
/// `map` is instruction_map's answer, or empty when the trace is of the co-executed program
/// itself. A buffer whose instructions lie outside the program counts as live throughout.
std::vector<MemorySample> activation_timeline(const MemoryReport& report,
                                              const std::vector<OpTiming>& ops,
                                              const std::vector<int64_t>& map,
                                              int64_t iteration_start_ns, int64_t iteration_end_ns);

}  // namespace dhelix::rt
