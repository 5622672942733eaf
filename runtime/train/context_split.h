#pragma once
// The data loader's share for one context-parallel rank. Under CP every rank of a CP group
// reads the same micro-batch (the same sequences, the same DP coordinate) and keeps the
// tokens its ring attention owns: chunks r and 2·cp - 1 - r of each sequence, in that order
// (the load-balanced causal split, runtime/kernels/context_parallel.h).
//
//   cp = 2, seq_length 8, one sequence t0..t7 (targets y0..y7):
//     CP rank 0 keeps t0 t1 t6 t7 (targets y0 y1 y6 y7), CP rank 1 keeps t2 t3 t4 t5.
//
// A target stays with its token, so the loss of a rank is the loss of its positions, and
// the mean over the CP group's equal shares is the mean over the whole sequence.

#include <cstdint>

#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// CP rank `cp_rank`'s share of `full` (batch sequences of seq_length tokens, row-major):
/// batch sequences of seq_length / cp tokens. seq_length must be a multiple of 2·cp
/// (checked by the model, runtime/model/stage_model.cc); DHELIX_CHECKs it.
MicroBatchTokens context_parallel_share(const MicroBatchTokens& full, int64_t batch,
                                        int64_t seq_length, int64_t cp, int64_t cp_rank);

}  // namespace dhelix::rt
