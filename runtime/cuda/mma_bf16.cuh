#pragma once
// One warp's bf16 tensor-core product, mma.sync.m16n8k16 (sm_80 and later), and the
// fragment layouts the attention kernels (kernels_attention_tc*.cu) build by hand.
// Device code only.
//
// With g = lane / 4 (the lane's group) and c = lane % 4, the PTX ISA's layouts are
//
//   A, 16 x 16 bf16, row-major, 4 registers of 2 values (low half = lower column):
//     a[0] = A[g][2c, 2c+1]     a[1] = A[g+8][2c, 2c+1]
//     a[2] = A[g][2c+8, 2c+9]   a[3] = A[g+8][2c+8, 2c+9]
//   B, 16 x 8 bf16 (k x n), 2 registers:
//     b[0] = B[2c, 2c+1][g]     b[1] = B[2c+8, 2c+9][g]
//   C, D, 16 x 8 fp32, 4 values:
//     d[0], d[1] = D[g][2c, 2c+1]   d[2], d[3] = D[g+8][2c, 2c+1]
//
// Two C tiles side by side (columns 0..7 and 8..15) hold, per lane, exactly the values of
// one A tile at the same rows, so a product's result becomes the next product's A operand
// in registers (pack_a_from_c): FlashAttention-2's P x V without a trip through memory.

#include <cuda_bf16.h>

#include <cstdint>

namespace dhelix::cuda::mma {

/// Lane's group (row within 8) and column pair index.
__device__ inline int lane_group() { return static_cast<int>(threadIdx.x % 32) / 4; }
__device__ inline int lane_pair() { return static_cast<int>(threadIdx.x % 4); }

/// Two bf16 values in one register, `low` in the low half.
__device__ inline uint32_t pack(__nv_bfloat16 low, __nv_bfloat16 high) {
  const uint32_t lo = __bfloat16_as_ushort(low);
  const uint32_t hi = __bfloat16_as_ushort(high);
  return lo | (hi << 16);
}

/// Two fp32 values rounded to nearest even into one register.
__device__ inline uint32_t pack_rounded(float low, float high) {
  return pack(__float2bfloat16_rn(low), __float2bfloat16_rn(high));
}

/// d += A x B on the tensor cores, fp32 accumulation.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The A operand (16 x 16) made of two C tiles: `left` holds columns 0..7, `right` 8..15.
__device__ inline void pack_a_from_c(const float (&left)[4], const float (&right)[4],
                                     uint32_t (&a)[4]) {
  a[0] = pack_rounded(left[0], left[1]);
  a[1] = pack_rounded(left[2], left[3]);
  a[2] = pack_rounded(right[0], right[1]);
  a[3] = pack_rounded(right[2], right[3]);
}

/// The largest value of a row over the four lanes that hold it (exact in any order).
__device__ inline float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

/// The sum of a row's four lane partials: (p0 + p1) + (p2 + p3), on every lane.
__device__ inline float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

}  // namespace dhelix::cuda::mma
