#pragma once
// dhelix-run's measured memory, per rank, at the end of a run: every rank's MemoryReport
// (runtime/memory/memory_report.h) gathered at rank 0 over MPI, printed one line per rank,
// and written into dhelix-run --trace's metadata (otherData.memory, run_trace.h), where
// dhelix-diff --measured reads it (emitter/measured_memory.h).
//
//   memory rank 1 (stage 0): weights 0.390 MiB, gradients 0.390 MiB, optimizer states
//   0.781 MiB, activations 1.250 MiB peak (live peak 1.125 MiB, of which the plan counts
//   0.750 MiB)
//
// (one line each). MiB = 2^20 bytes, three decimals; the trace keeps the exact bytes.
// Buffer names stay on their rank: what travels is each buffer's offset, bytes and first
// and last instruction, all the "memory" counter track of the trace needs.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "runtime/memory/memory_report.h"

namespace dhelix::rt {

/// One rank's memory and the pipeline stage it holds.
struct RankMemory {
  int64_t rank = 0;
  int64_t stage = 0;
  MemoryReport report;  ///< buffer names empty after a gather
};

/// The record as one array of integers, the form the gather sends.
std::vector<int64_t> flatten_memory(int64_t stage, const MemoryReport& report);
/// The inverse of flatten_memory (names left empty); aborts on a malformed array.
RankMemory unflatten_memory(int64_t rank, const int64_t* flat, size_t size);

/// Collective over MPI_COMM_WORLD: rank 0 receives every rank's record, in rank order;
/// the other ranks get an empty vector.
std::vector<RankMemory> gather_rank_memory(int64_t rank, int64_t stage, const MemoryReport& report);

/// "memory rank R (stage S): weights ... (live peak ... MiB, of which the plan counts ...
/// MiB)\n", one line per rank.
std::string memory_report_lines(const std::vector<RankMemory>& ranks);

/// One rank's record for the trace's otherData.memory: its rank, stage, the exact bytes of
/// each term, the activation element size, the bytes per parameter of each model-state
/// term, the optimizer's shards and the arena's buffer count.
OrderedJson memory_record_json(const RankMemory& memory);

}  // namespace dhelix::rt
