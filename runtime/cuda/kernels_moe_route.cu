// The MoE router's kernels (moe_cuda.h: moe_route, moe_router_logits_backward) without a
// serial loop over the layer: a warp per token for top-k, softmax and the backward row; a
// histogram and an exclusive scan over tiles of assignments for the routed counts, the
// kept counts and the padded rows; a block reduction and one final pass for the aux loss
// (runtime/kernels/moe_route_scan.h, with a worked example). The host twin is
// runtime/cpu/moe_route_twin.cc, loop for kernel.
//
// Failure rules: the shape is checked before any launch (check_moe_shape, Error
// kUnsupported naming the limit); a workspace smaller than moe_route_workspace_bytes is an
// Error(kInternal) naming both sizes. No atomics: integer counts per warp and block, fixed
// trees, so the same bits every run.

#include <cuda_bf16.h>
#include <fmt/format.h>

#include <algorithm>

#include "lib/error.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/cuda/tile_scan.cuh"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_route_scan.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;
using kernels::kMoeAuxThreads;
using kernels::kMoeScanTile;

using detail::global_warp;
using detail::grid_warps;
using detail::kFullMask;
using detail::lane_id;

// Logits one lane holds (experts lane, lane + 32, ...): registers, not a row per thread.
constexpr int kLaneSlots = static_cast<int>(kMaxMoeExperts / kWarpSize);
static_assert(kMaxMoeExperts % kWarpSize == 0 && kLaneSlots <= 32, "taken is a 32-bit mask");
static_assert((kMoeAuxThreads & (kMoeAuxThreads - 1)) == 0, "the aux tree halves");

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }

// The warp's best (value, index) by router_ranks_before, on every lane: a strict order on
// distinct indices, so the xor butterfly leaves the same winner everywhere.
__device__ inline void warp_best(float& value, int64_t& index) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(kFullMask, value, offset);
    const int64_t other_index = __shfl_xor_sync(kFullMask, index, offset);
    if (kernels::router_ranks_before(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
}

// A warp per token: slot j's expert is the warp's best untaken logit; the chosen gates on
// lane 0 in slot order; the full softmax's sum in lane-tree order.
__global__ void moe_topk_kernel(MoeDeviceShape s, const bf16* logits, MoeDeviceRouting r) {
  const int lane = lane_id();
  for (int64_t t = global_warp(); t < s.tokens; t += grid_warps()) {
    const bf16* row = logits + t * s.experts;
    float z[kLaneSlots];
    float m = -INFINITY;
#pragma unroll
    for (int q = 0; q < kLaneSlots; ++q) {
      const int64_t e = lane + q * kWarpSize;
      z[q] = e < s.experts ? f32(row[e]) : 0.0f;
      if (e < s.experts) m = kernels::max_float(m, z[q]);
    }
    int32_t* chosen = r.chosen + t * s.top_k;
    unsigned taken = 0;
    for (int64_t j = 0; j < s.top_k; ++j) {
      float value = 0.0f;
      int64_t index = -1;
#pragma unroll
      for (int q = 0; q < kLaneSlots; ++q) {
        const int64_t e = lane + q * kWarpSize;
        const bool free = e < s.experts && ((taken >> q) & 1u) == 0;
        if (free && kernels::router_ranks_before(z[q], e, value, index)) {
          value = z[q];
          index = e;
        }
      }
      warp_best(value, index);
      if (index % kWarpSize == lane) taken |= 1u << (index / kWarpSize);
      if (lane == 0) chosen[j] = static_cast<int32_t>(index);
    }
    if (lane == 0) {
      kernels::router_topk_gates(
          s.top_k, [row](int64_t e) { return f32(row[e]); }, chosen, r.gate + t * s.top_k);
    }
    m = detail::warp_max(m);
    float partial = 0.0f;
#pragma unroll
    for (int q = 0; q < kLaneSlots; ++q) {
      if (lane + q * kWarpSize < s.experts) partial += expf(z[q] - m);
    }
    const float sum = detail::warp_lane_tree_sum(partial);
#pragma unroll
    for (int q = 0; q < kLaneSlots; ++q) {
      const int64_t e = lane + q * kWarpSize;
      if (e < s.experts) r.probs[t * s.experts + e] = kernels::router_softmax_value(z[q], m, sum);
    }
  }
}

// This thread's assignment in tile `tile`: its expert, or -1 when it is not counted (past
// the end, or dropped when `kept` is given).
__device__ inline int tile_expert(int64_t n, const int32_t* chosen, const uint8_t* kept,
                                  int64_t tile) {
  const int64_t a = tile * kMoeScanTile + threadIdx.x;
  return a < n && (kept == nullptr || kept[a] != 0) ? chosen[a] : -1;
}

// Pass 1, a block per tile: tile_counts[e][tile] = the tile's counted assignments to e.
__global__ void moe_tile_counts_kernel(int64_t n, int64_t experts, const int32_t* chosen,
                                       const uint8_t* kept, int32_t* tile_counts) {
  extern __shared__ int warp_counts[];
  const int64_t tiles = kernels::moe_scan_tiles(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    detail::zero_warp_counts(warp_counts, experts);
    detail::warp_rank_and_count(tile_expert(n, chosen, kept, tile), experts, warp_counts);
    __syncthreads();
    detail::store_tile_counts(warp_counts, experts, tiles, tile, tile_counts);
    __syncthreads();
  }
}

// Pass 2, a warp per expert: its row of tile counts becomes its exclusive scan;
// totals[e] = the expert's count times `scale`.
__global__ void moe_tile_scan_kernel(int64_t experts, int64_t tiles, int64_t scale,
                                     int32_t* tile_counts, int64_t* totals) {
  for (int64_t e = global_warp(); e < experts; e += grid_warps()) {
    const int64_t total = detail::warp_exclusive_scan_row(tile_counts + e * tiles, tiles);
    if (lane_id() == 0) totals[e] = total * scale;
  }
}

// Pass 3, a block per tile: each kept assignment's padded row from its expert's scanned
// offset, the tile's earlier warps' counts and its rank in the warp; -1 for the dropped.
__global__ void moe_tile_rows_kernel(MoeDeviceShape s, MoeDeviceRouting r,
                                     const int32_t* tile_offsets) {
  extern __shared__ int warp_counts[];
  const int64_t n = s.tokens * s.top_k, tiles = kernels::moe_scan_tiles(n);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    detail::zero_warp_counts(warp_counts, s.experts);
    const int e = tile_expert(n, r.chosen, r.kept, tile);
    const int rank = detail::warp_rank_and_count(e, s.experts, warp_counts);
    __syncthreads();
    detail::scan_warp_counts(warp_counts, s.experts);
    const int64_t a = tile * kMoeScanTile + threadIdx.x;
    if (a < n) {
      r.row[a] = e < 0 ? -1
                       : kernels::moe_padded_row_of(e, s.capacity, tile_offsets[e * tiles + tile],
                                                    warp_counts[warp * s.experts + e] + rank);
    }
    __syncthreads();
  }
}

// Whether assignment a fits its expert's capacity (moe_capacity.h), after every n_e is
// written: O(1) for an expert within its capacity, O(T k) for one over it.
__global__ void moe_keep_kernel(MoeDeviceShape s, MoeDeviceRouting r) {
  const int64_t n = s.tokens * s.top_k;
  for (int64_t a = global_thread(); a < n; a += grid_threads()) {
    r.kept[a] = kernels::keeps_assignment(n, r.chosen, r.gate, r.routed, s.capacity, a) ? 1 : 0;
  }
}

// values[kMoeAuxThreads] in shared memory, summed by tree_sum_pow2's halving tree, one
// level per step; the total in values[0].
__device__ inline void block_tree_sum(double* values) {
  __syncthreads();
  for (int64_t half = kMoeAuxThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) values[threadIdx.x] += values[threadIdx.x + half];
    __syncthreads();
  }
}

// The aux loss's first pass: a block per kMoeAuxBlockItems terms, one partial each.
__global__ void moe_aux_partial_kernel(MoeDeviceShape s, MoeDeviceRouting r, double* partials) {
  __shared__ double values[kMoeAuxThreads];
  const int64_t items = s.tokens * s.experts, blocks = kernels::moe_aux_blocks(s.tokens, s.experts);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    values[threadIdx.x] =
        kernels::moe_aux_thread_partial(b, threadIdx.x, items, s.experts, r.probs, r.routed);
    block_tree_sum(values);
    if (threadIdx.x == 0) partials[b] = values[0];
    __syncthreads();
  }
}

// The final pass, one block: the partials strided over its threads, the tree, the scale.
__global__ void moe_aux_final_kernel(MoeDeviceShape s, int64_t blocks, const double* partials,
                                     float* aux_loss) {
  __shared__ double values[kMoeAuxThreads];
  values[threadIdx.x] = kernels::moe_aux_final_partial(threadIdx.x, blocks, partials);
  block_tree_sum(values);
  if (threadIdx.x == 0) {
    *aux_loss =
        kernels::moe_aux_loss_of_sum(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, values[0]);
  }
}

// A warp per token: sum_e p_e dp_e in lane-tree order, sum_j g_j dg_j in slot order (every
// lane), then each lane its experts' dz (router_backward_element); dp_e from n_e on the fly.
__global__ void moe_router_grad_kernel(MoeDeviceShape s, MoeDeviceRouting r, const float* dgate,
                                       float aux_dloss, bf16* dz) {
  const bool aux = s.aux_loss_coeff > 0.0 && aux_dloss != 0.0f;
  const int lane = lane_id();
  auto dp = [&s, &r, aux_dloss](int64_t e) {
    return kernels::load_balancing_gradient_at(s.tokens, s.top_k, s.experts, s.aux_loss_coeff,
                                               r.routed[e], aux_dloss);
  };
  for (int64_t t = global_warp(); t < s.tokens; t += grid_warps()) {
    const float* p = r.probs + t * s.experts;
    const int32_t* chosen = r.chosen + t * s.top_k;
    const float* gate = r.gate + t * s.top_k;
    const float* dg = dgate + t * s.top_k;
    float partial = 0.0f;
    if (aux) {
      for (int64_t e = lane; e < s.experts; e += kWarpSize) partial += p[e] * dp(e);
    }
    const float aux_inner = aux ? detail::warp_lane_tree_sum(partial) : 0.0f;
    const float gate_inner = kernels::router_gate_inner(s.top_k, gate, dg);
    for (int64_t e = lane; e < s.experts; e += kWarpSize) {
      dz[t * s.experts + e] = __float2bfloat16_rn(kernels::router_backward_element(
          e, s.top_k, chosen, gate, dg, p[e], aux, aux ? dp(e) : 0.0f, aux_inner, gate_inner));
    }
  }
}

LaunchConfig aux_launch(int64_t blocks) {
  LaunchConfig config;
  config.grid.x = std::min(blocks, kMaxGridX);
  config.block.x = kMoeAuxThreads;
  return config;
}

}  // namespace

int64_t moe_route_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return kernels::moe_route_scratch(tokens, top_k, experts).bytes;
}

std::vector<KernelEntry> moe_route_kernels() {
  return {{"moe_topk_kernel", reinterpret_cast<const void*>(&moe_topk_kernel)},
          {"moe_tile_counts_kernel", reinterpret_cast<const void*>(&moe_tile_counts_kernel)},
          {"moe_tile_scan_kernel", reinterpret_cast<const void*>(&moe_tile_scan_kernel)},
          {"moe_tile_rows_kernel", reinterpret_cast<const void*>(&moe_tile_rows_kernel)},
          {"moe_keep_kernel", reinterpret_cast<const void*>(&moe_keep_kernel)},
          {"moe_aux_partial_kernel", reinterpret_cast<const void*>(&moe_aux_partial_kernel)},
          {"moe_aux_final_kernel", reinterpret_cast<const void*>(&moe_aux_final_kernel)},
          {"moe_router_grad_kernel", reinterpret_cast<const void*>(&moe_router_grad_kernel)}};
}

void moe_route(const MoeDeviceShape& shape, const bf16* logits, MoeDeviceRouting routing,
               const Workspace& workspace, cudaStream_t stream) {
  check_moe_shape(shape);
  const int64_t n = shape.tokens * shape.top_k;
  const kernels::MoeRouteScratch scratch =
      kernels::moe_route_scratch(shape.tokens, shape.top_k, shape.experts);
  if (workspace.data == nullptr || workspace.bytes < scratch.bytes) {
    throw Error(ErrorCode::kInternal,
                fmt::format("moe_route: the stream's workspace holds {} bytes, the router needs {}",
                            workspace.bytes, scratch.bytes));
  }
  auto* tile_counts = static_cast<int32_t*>(workspace.data);
  auto* partials =
      reinterpret_cast<double*>(static_cast<char*>(workspace.data) + scratch.aux_offset_bytes);
  const LaunchConfig tiles = detail::tile_launch(scratch.tiles, shape.experts);
  const LaunchConfig experts = warp_per_row_launch(shape.experts);
  detail::launch(warp_per_row_launch(shape.tokens), stream, moe_topk_kernel, shape, logits,
                 routing);
  // n_e over every assignment, then the kept set, then the kept ones counted and placed.
  detail::launch(tiles, stream, moe_tile_counts_kernel, n, shape.experts, routing.chosen,
                 static_cast<const uint8_t*>(nullptr), tile_counts);
  detail::launch(experts, stream, moe_tile_scan_kernel, shape.experts, scratch.tiles, int64_t{1},
                 tile_counts, routing.routed);
  detail::launch_per_item(n, stream, moe_keep_kernel, shape, routing);
  detail::launch(tiles, stream, moe_tile_counts_kernel, n, shape.experts, routing.chosen,
                 static_cast<const uint8_t*>(routing.kept), tile_counts);
  detail::launch(experts, stream, moe_tile_scan_kernel, shape.experts, scratch.tiles, shape.hidden,
                 tile_counts, routing.send_counts);
  detail::launch(tiles, stream, moe_tile_rows_kernel, shape, routing,
                 static_cast<const int32_t*>(tile_counts));
  detail::launch(aux_launch(scratch.aux_blocks), stream, moe_aux_partial_kernel, shape, routing,
                 partials);
  detail::launch(aux_launch(1), stream, moe_aux_final_kernel, shape, scratch.aux_blocks,
                 static_cast<const double*>(partials), routing.aux_loss);
}

void moe_router_logits_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                                const float* dgate, float aux_dloss, bf16* dz,
                                cudaStream_t stream) {
  detail::launch(warp_per_row_launch(shape.tokens), stream, moe_router_grad_kernel, shape, routing,
                 dgate, aux_dloss, dz);
}

}  // namespace dhelix::cuda
