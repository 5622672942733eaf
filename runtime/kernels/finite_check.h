#pragma once
// Whether a gradient holds only finite numbers: the test dhelix-run makes every step before
// the update (runtime/train/trainer.cc). Written once for both backends: the CPU engine
// loops over count_non_finite; the CUDA engine's reduction kernel (kernels_rowwise.cu,
// flag_non_finite) applies is_finite_value to each element in its threads and writes one
// flag, so only 4 bytes cross to the host each step instead of every gradient.
//
// The test looks at the exponent bits (all ones: inf or NaN), not std::isfinite, so that it
// is the same function on host and device and holds under fast-math flags.

#include <cstdint>
#include <cstring>

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// True unless `value` is +-inf or NaN.
DHELIX_HOST_DEVICE inline bool is_finite_value(float value) {
  uint32_t bits = 0;
  memcpy(&bits, &value, sizeof(bits));
  return (bits & 0x7f800000u) != 0x7f800000u;
}

/// How many of values[0, count) are not finite.
DHELIX_HOST_DEVICE inline int64_t count_non_finite(const float* values, int64_t count) {
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad += is_finite_value(values[i]) ? 0 : 1;
  return bad;
}

}  // namespace dhelix::kernels
