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
// the start of its kernel on a V100), so every paired block starts 20 us late:
//
//   P'(F, B) = 20 us + P(F, B)   when F and B are both non-empty (a paired segment)
//   P'(F, B) = P(F, B)           for a strand alone (Megatron's ops are enqueued ahead)
//
// dhelix-run enqueues every block ahead of time and orders the blocks with CUDA events
// (docs/gpu.md), so its blocks pay no host round trip: a job says "block_sync": "host" only
// to model a runtime that synchronises (the paper's jobs under examples/jobs do, since their
// measurements are the prototype's). The interval is charged to the block's communication
// as exposed time (planner/layer_costs.h), as Table 7 does.
//
// Worked example: a paired block whose ops would take 450 us after a barrier takes 470 us
// with "block_sync": "host"; a layer pair cut into 6 paired blocks pays 120 us.

#include "lib/parallel_spec.h"

namespace dhelix {

/// One PyTorch operator's host-to-kernel launch round trip, us (NVIDIA Nsight Systems guide).
inline constexpr double kHostBlockLaunchUs = 20.0;

/// The launch interval every paired block of `parallel`'s job starts with, us.
inline double paired_block_gap_us(const ParallelSpec& parallel) {
  return parallel.host_synchronized_blocks ? kHostBlockLaunchUs : 0.0;
}

}  // namespace dhelix
