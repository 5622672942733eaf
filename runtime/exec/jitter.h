#pragma once
// dhelix-run --jitter-us: a pseudo-random delay before every instruction, on both backends
// (runtime/exec/interpreter.cc sleeps; runtime/cuda/device_executor.cc enqueues a kernel
// that occupies the stream). Timing then varies far more than it does naturally, so a
// missing dependency, which lets an op read a buffer before it is written, shows up as a
// --verify difference instead of hiding behind lucky timing. The delays are a fixed
// sequence per (seed, instruction), so a failing run can be repeated.

#include <cstdint>

namespace dhelix::rt {

/// The delay before instruction `index`, uniform in [0, max_us] microseconds: splitmix64
/// (Steele, Lea and Flood 2014) of (seed, index); 0 when max_us <= 0.
inline int64_t jitter_us_for(uint64_t seed, uint64_t index, int64_t max_us) {
  if (max_us <= 0) return 0;
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<int64_t>(z % static_cast<uint64_t>(max_us + 1));
}

}  // namespace dhelix::rt
