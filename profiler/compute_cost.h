#pragma once
// Analytic solo time of a computation operator on one GPU (the `model` profiler backend).
// Every formula and constant is explained, with its source, in docs/cost-model.md.
//
// A kernel is described by a KernelCost: a fixed launch overhead, a compute part that scales
// with the SMs the kernel gets (in whole waves of output tiles for GEMMs, fluidly otherwise)
// and a memory part that scales with the memory bandwidth it gets. Its time is
//   launch_us + max(compute part, memory part)   (a roofline per kernel),
// so the same description gives the solo time and the time under interference
// (interference.h takes SMs and memory bandwidth away).
//
// Worked example (A100, 312 TFLOP/s, 108 SMs, gemm_efficiency 0.84): a 1024^3 bf16 GEMM has
// 8 x 8 = 64 tiles of 128 x 128 -> one wave using 64 of 108 SMs (utilisation 0.593); its
// smallest dimension 1024 gives the size factor 1024 / (1024 + 96) = 0.914; so it runs at
// 0.84 * 0.593 * 0.914 = 45.5 % of peak: 2.147 GFLOP / 142 TFLOP/s = 15.1 us, plus 3 us launch
// = 18.1 us, i.e. 38 % of peak overall, the figure measured for cuBLAS at 1024^3.

#include <cstdint>

#include "lib/cluster_spec.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// Fixed cost of one kernel launch plus its ramp-up and tail, microseconds (an assumption:
/// back-to-back CUDA kernels on one stream show gaps of a few microseconds).
inline constexpr double kKernelLaunchUs = 3.0;
/// Output tile of one GEMM thread block (CUTLASS/cuBLAS's common 128 x 128 bf16 tile).
inline constexpr int64_t kGemmTileM = 128;
inline constexpr int64_t kGemmTileN = 128;
/// Small-dimension penalty d / (d + kGemmSizeHalfDim) with d = min(max(m, 128), max(n, 128),
/// k) (m and n below one tile are padded to it, which the tile count charges): fitted so a
/// 1024^3 GEMM on an A100 reaches ~38 % of peak (hardware-figures.md).
inline constexpr double kGemmSizeHalfDim = 96.0;
/// Query rows of one flash-attention thread block (FlashAttention-2's forward block size).
inline constexpr int64_t kAttentionBlockRows = 128;
/// Backward attention work relative to forward, as FlashAttention's benchmark counts it
/// (Op.flops follows Megatron and counts 2x; the time model uses 2.5x).
inline constexpr double kAttentionBackwardFactor = 2.5;

/// How one kernel's time depends on the SMs and memory bandwidth it gets.
struct KernelCost {
  double launch_us = kKernelLaunchUs;
  /// Compute part with every SM of the GPU, microseconds (0 for memory-bound kernels).
  double compute_us = 0;
  /// Thread blocks (output tiles) of one wave each; 0: the compute part scales fluidly.
  int64_t tiles = 0;
  /// Memory part at the full usable memory bandwidth, microseconds.
  double memory_us = 0;
};

/// Resources a kernel gets while it runs; defaults are the whole GPU.
struct ComputeResources {
  int64_t sms = 0;               ///< SMs available; 0 means all of them
  double memory_fraction = 1.0;  ///< share of the usable memory bandwidth, in (0, 1]
};

/// Usable memory bandwidth of the GPU in bytes per microsecond: the peak
/// (memory_bandwidth_gbps) times memory_efficiency.
double memory_bytes_per_us(const GpuSpec& gpu);

/// Waves a grid of `tiles` blocks takes on `sms` SMs: ceil(tiles / sms). 0 when tiles is 0.
int64_t gemm_waves(int64_t tiles, int64_t sms);
/// Output tiles of an m x n GEMM: ceil(m / 128) * ceil(n / 128).
int64_t gemm_tiles(int64_t m, int64_t n);
/// The small-dimension factor d / (d + 96), d = min(max(m, 128), max(n, 128), k), in (0, 1).
double gemm_size_factor(int64_t m, int64_t n, int64_t k);

/// KernelCost of a dense GEMM (m x k times k x n, `batch` independent groups in one launch).
KernelCost gemm_kernel_cost(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k, int64_t batch,
                            int64_t element_bytes);
/// KernelCost of any computation op (DHELIX_CHECKs that `op` is not communication).
KernelCost compute_kernel_cost(const GpuSpec& gpu, const Op& op);

/// Time of a kernel under `resources`, microseconds.
double kernel_time_us(const GpuSpec& gpu, const KernelCost& cost, ComputeResources resources = {});
/// Solo time of a computation op on the whole GPU, microseconds.
double compute_time_us(const GpuSpec& gpu, const Op& op);

/// Whether the op's memory part dominates its compute part (it slows with memory bandwidth).
bool is_memory_bound(const KernelCost& cost);

}  // namespace dhelix
