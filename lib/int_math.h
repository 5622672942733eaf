#pragma once
// Integer arithmetic shared by the DAG builder, the planner and the profiler.

#include <cstdint>

#include "lib/error.h"

namespace dhelix {

/// ⌈a / b⌉ for a >= 0 and b > 0 (aborts otherwise: callers pass sizes and counts that
/// validation has already made non-negative). Exact for every such pair: unlike
/// (a + b - 1) / b it cannot overflow.
inline int64_t ceil_div(int64_t a, int64_t b) {
  DHELIX_CHECK(a >= 0 && b > 0);
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace dhelix
