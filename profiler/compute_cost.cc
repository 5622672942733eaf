#include "profiler/compute_cost.h"

#include <algorithm>
#include <cmath>

#include "lib/error.h"
#include "lib/int_math.h"

namespace dhelix {
namespace {

constexpr double kUsPerSecond = 1e6;

// Peak tensor-core rate of the whole GPU, FLOP per microsecond.
double peak_flops_per_us(const GpuSpec& gpu) { return gpu.peak_bf16_tflops * 1e12 / kUsPerSecond; }

double memory_us(const GpuSpec& gpu, double bytes) { return bytes / memory_bytes_per_us(gpu); }

// Flash-attention forward work as FlashAttention's benchmark counts it: 4·B·H·d times the
// (query, key) pairs computed: q·kv, halved under a causal mask. A sliding window W < kv
// (Mistral) leaves q·W - W²/2 causal pairs (each query sees at most W keys; the first W
// queries see fewer), q·W without the mask. Backward is 2.5x the forward.
double attention_work_flops(const Op& op) {
  const OpShape& s = op.shape;
  const auto q = static_cast<double>(s.q_len);
  const auto kv = static_cast<double>(s.kv_len);
  double pairs = s.causal ? q * kv / 2 : q * kv;
  if (s.window > 0 && s.window < s.kv_len) {
    const auto w = static_cast<double>(s.window);
    pairs = std::min(pairs, s.causal && w <= q ? q * w - w * w / 2 : q * w);
  }
  double work = 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) * pairs *
                static_cast<double>(s.head_dim);
  if (op.pass == Pass::kBackward) work *= kAttentionBackwardFactor;
  return work;
}

KernelCost memory_bound_cost(const GpuSpec& gpu, const Op& op) {
  KernelCost cost;
  cost.memory_us = memory_us(gpu, static_cast<double>(op.bytes_read + op.bytes_written));
  return cost;
}

// A GEMM-like op whose shape fields are not filled: fluid compute at gemm_efficiency.
KernelCost fluid_gemm_cost(const GpuSpec& gpu, const Op& op) {
  KernelCost cost;
  cost.compute_us = op.flops / (peak_flops_per_us(gpu) * gpu.gemm_efficiency);
  cost.memory_us = memory_us(gpu, static_cast<double>(op.bytes_read + op.bytes_written));
  return cost;
}

KernelCost gemm_like_cost(const GpuSpec& gpu, const Op& op) {
  const OpShape& s = op.shape;
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) return fluid_gemm_cost(gpu, op);
  return gemm_kernel_cost(gpu, s.m, s.n, s.k, std::max<int64_t>(s.batch, 1), dtype_bytes(op.dtype));
}

KernelCost attention_cost(const GpuSpec& gpu, const Op& op) {
  KernelCost cost;
  cost.compute_us = attention_work_flops(op) / (peak_flops_per_us(gpu) * gpu.attention_efficiency);
  cost.memory_us = memory_us(gpu, static_cast<double>(op.bytes_read + op.bytes_written));
  return cost;  // tiles = 0: blocks of unequal (causal) work smooth out the wave edges
}

}  // namespace

double memory_bytes_per_us(const GpuSpec& gpu) {
  return gpu.memory_bandwidth_gbps * 1e9 * gpu.memory_efficiency / kUsPerSecond;
}

int64_t gemm_waves(int64_t tiles, int64_t sms) {
  DHELIX_CHECK(sms > 0);
  return ceil_div(tiles, sms);
}

int64_t gemm_tiles(int64_t m, int64_t n) {
  return ceil_div(m, kGemmTileM) * ceil_div(n, kGemmTileN);
}

double gemm_size_factor(int64_t m, int64_t n, int64_t k) {
  // m and n below one tile count as one tile: the kernel computes the whole padded tile,
  // and the tile count (gemm_tiles) already charges it. Penalising the padding again made
  // an m = 1 GEMM (sequence 1) cost 54 times an m = 128 one: a 3.3 s iteration for Llama-8B
  // at sequence 1 against 0.17 s at 128 (docs/cost-model.md).
  const double d =
      static_cast<double>(std::min({std::max(m, kGemmTileM), std::max(n, kGemmTileN), k}));
  return d / (d + kGemmSizeHalfDim);
}

KernelCost gemm_kernel_cost(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k, int64_t batch,
                            int64_t element_bytes) {
  DHELIX_CHECK(m > 0 && n > 0 && k > 0 && batch > 0 && gpu.sm_count > 0);
  KernelCost cost;
  // All groups' tiles share one launch (grouped kernels schedule them as one grid), so waves
  // count over batch * tiles; each group keeps its own size factor and tile padding.
  cost.tiles = batch * gemm_tiles(m, n);
  const double tile_flops = 2.0 * kGemmTileM * kGemmTileN * static_cast<double>(k);
  // Per-SM rate at the shape's efficiency; one wave = every busy SM finishing one tile.
  const double sm_flops_per_us = peak_flops_per_us(gpu) * gpu.gemm_efficiency *
                                 gemm_size_factor(m, n, k) / static_cast<double>(gpu.sm_count);
  const int64_t waves = gemm_waves(cost.tiles, gpu.sm_count);
  cost.compute_us = static_cast<double>(waves) * tile_flops / sm_flops_per_us;
  // Each factor converted before multiplying: the int64 products could overflow.
  const double md = static_cast<double>(m);
  const double nd = static_cast<double>(n);
  const double kd = static_cast<double>(k);
  const double bytes = static_cast<double>(batch) * static_cast<double>(element_bytes) *
                       (md * kd + kd * nd + md * nd);
  cost.memory_us = memory_us(gpu, bytes);
  return cost;
}

KernelCost compute_kernel_cost(const GpuSpec& gpu, const Op& op) {
  DHELIX_CHECK_MSG(!is_communication(op.kind), op.id);
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kGroupedGemm:
    case OpKind::kRouter:
    case OpKind::kHead:
      return gemm_like_cost(gpu, op);
    case OpKind::kAttention:
      return attention_cost(gpu, op);
    default:
      return memory_bound_cost(gpu, op);
  }
}

double kernel_time_us(const GpuSpec& gpu, const KernelCost& cost, ComputeResources resources) {
  const int64_t sms = resources.sms > 0 ? std::min(resources.sms, gpu.sm_count) : gpu.sm_count;
  DHELIX_CHECK(resources.memory_fraction > 0 && resources.memory_fraction <= 1.0 + 1e-12);
  double compute = cost.compute_us;
  if (sms < gpu.sm_count && compute > 0) {
    if (cost.tiles > 0) {
      compute *= static_cast<double>(gemm_waves(cost.tiles, sms)) /
                 static_cast<double>(gemm_waves(cost.tiles, gpu.sm_count));
    } else {
      compute *= static_cast<double>(gpu.sm_count) / static_cast<double>(sms);
    }
  }
  return cost.launch_us + std::max(compute, cost.memory_us / resources.memory_fraction);
}

double compute_time_us(const GpuSpec& gpu, const Op& op) {
  return kernel_time_us(gpu, compute_kernel_cost(gpu, op));
}

bool is_memory_bound(const KernelCost& cost) { return cost.memory_us > cost.compute_us; }

}  // namespace dhelix
