#pragma once
// Upper bounds on a job's parallel settings, shared by the job reader (a file's value is
// refused where it is read, with its JSON pointer) and job validation (flags bypass the
// reader; products of sizes within these bounds are checked there). Far above any real
// job; within them every product the planner forms (world size, micro_batch_size·dp,
// tokens per rank, tensor bytes) fits in int64, and the O(micro-batches) schedule and
// simulation finish. docs/jobs.md lists them.

#include <cstdint>

#include "lib/json_reader.h"
#include "lib/model_shape_checks.h"

namespace dhelix {

/// dp, tp, cp, pp, ep, expert_tp: at most 2^20.
inline constexpr int64_t kMaxParallelSize = int64_t{1} << 20;
/// dp·tp·cp·pp: at most 2^24 GPUs.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
/// micro_batch_size, global_batch_size: at most 2^32 sequences.
inline constexpr int64_t kMaxBatchSequences = int64_t{1} << 32;
/// seq_length: at most 2^24 tokens.
inline constexpr int64_t kMaxSeqLength = int64_t{1} << 24;
/// global_batch_size / (micro_batch_size·dp): at most 2^20 micro-batches per iteration.
inline constexpr int64_t kMaxMicroBatches = int64_t{1} << 20;
/// micro-batches · pp: the plan lists about two tasks per micro-batch and stage (1.5 KB of
/// JSON each); beyond 2^17 the plan outgrows the 256 MiB every JSON reader accepts, and
/// dhelix-plan needs gigabytes (2^19 of them ended in std::bad_alloc at 4 GB). A 405B job
/// with pp 16 and 256 micro-batches has 2^12.
inline constexpr int64_t kMaxPipelineTasks = int64_t{1} << 17;
/// micro-batches · num_layers: every layer's forward and backward of every micro-batch is a
/// run of instructions in the rank programs the checker and dhelix-run lower (about 18
/// bytes of program per instruction, 35 instructions a layer pass: 2^17 took 2.3 GB to
/// check). 126 layers with 4096 micro-batches is 2^19.
inline constexpr int64_t kMaxLayerPasses = int64_t{1} << 20;

/// The reader's ranges of the sizes above.
inline constexpr IntRange kParallelSizeRange = {.min = 1, .max = kMaxParallelSize};
inline constexpr IntRange kBatchSequencesRange = {.min = 1, .max = kMaxBatchSequences};
inline constexpr IntRange kSeqLengthSettingRange = {.min = 1, .max = kMaxSeqLength};
/// recompute_num_layers, decoder_first/last_pipeline_num_layers: layer counts, at most
/// num_layers' own bound (2^16).
inline constexpr IntRange kLayerSettingRange = kLayerCountRange;

}  // namespace dhelix
