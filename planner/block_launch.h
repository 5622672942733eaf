#pragma once
// The launch interval of a co-executed block (the DHelix paper's Table 7, "visible (launch
// interval)": "the small intervals between the launches of computation and communication
// kernels at the start of each paired segment").
//
// Where it comes from. The paper's prototype calls torch.cuda.synchronize() after every
// block (shared/reference/prior-art.md) and then issues the next block's operators from
// Python: the GPU idles from the barrier until the first kernel of the next block is
// launched. One PyTorch operator's host-to-kernel round trip is about 20 us (NVIDIA's
// Nsight Systems user guide measures ~20 us from the PyTorch call of an element-wise op to
// the start of its kernel on a V100). The prototype's block lists its compute ops before its
// communication ops (prior-art.md, "DCBlocks") and the host issues them one after another,
// so in a paired block (F and B both non-empty) the GPU waits 20 us for the first kernel,
// each later kernel cannot start before the host has issued it, and the collectives wait
// for every compute op's launch first:
//
//   compute op k (k = 0, 1, ..., in the order the compute stream runs them) starts no
//   earlier than 20 us · (k + 1); collective j (in the order they start, on either comm
//   stream) no earlier than 20 us · (1 + c + j), c = the block's compute ops; a strand alone
//   pays nothing (Megatron's ops are enqueued ahead). A kernel longer than 20 us lets the
//   host run ahead, so only runs of short kernels wait. A collective that the compute covers
//   hides its wait; one that is on the block's critical path shows it, which is what the
//   paper measures as 10-19 % of the communication (Table 7).
//
// dhelix-run enqueues every block ahead of time and orders the blocks with CUDA events
// (docs/gpu.md), so its blocks pay no host round trip: a job says "block_sync": "host" only
// to model a runtime that synchronises (the paper's jobs under examples/jobs do, since their
// measurements are the prototype's). The interval is charged to the block's communication
// as exposed time (planner/layer_costs.h), as Table 7 does.
//
// Worked example (tests/planner/segment_cost_test.cc): a block of f0 (50 us compute), b0
// (40 us compute) and an all-gather of 30 us: compute [20, 110], the all-gather waits for
// 20 · 3 = 60 us and runs [60, 90] under the compute; the block takes 110 us instead of 90.

#include "lib/parallel_spec.h"

namespace dhelix {

/// One PyTorch operator's host-to-kernel launch round trip, us (NVIDIA Nsight Systems guide).
inline constexpr double kHostBlockLaunchUs = 20.0;

/// The launch interval every paired block of `parallel`'s job starts with, us.
inline double paired_block_gap_us(const ParallelSpec& parallel) {
  return parallel.host_synchronized_blocks ? kHostBlockLaunchUs : 0.0;
}

}  // namespace dhelix
