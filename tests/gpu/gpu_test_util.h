#pragma once
// What the GPU tests share: the skip when no device is present (no driver counts as no
// device: cudaGetDeviceCount then returns an error), device buffers, bf16 rounding on the
// host, random inputs.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda::testing {

/// Devices present; 0 when there is no driver or no device.
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // clear the sticky error for later calls
    return 0;
  }
  return count;
}

/// Skips the test unless at least n devices are present.
#define DHELIX_REQUIRE_GPUS(n)                                                        \
  do {                                                                                \
    const int dhelix_devices = ::dhelix::cuda::testing::device_count();               \
    if (dhelix_devices < (n)) {                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << dhelix_devices; \
    }                                                                                 \
  } while (0)

/// Device memory for count elements of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t count) : count_(count) {
    DHELIX_CUDA(cudaMalloc(&data_, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host)
      : DeviceBuffer(static_cast<int64_t>(host.size())) {
    upload(host);
  }
  ~DeviceBuffer() { static_cast<void>(cudaFree(data_)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) {
    DHELIX_CUDA(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(count_));
    DHELIX_CUDA(cudaDeviceSynchronize());
    DHELIX_CUDA(cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  int64_t count_;
};

inline std::vector<float> random_floats(int64_t count, uint32_t seed, float low = -1.0f,
                                        float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = distribution(generator);
  return values;
}

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16_rn(values[i]);
  return out;
}

inline std::vector<float> to_f32(const std::vector<__nv_bfloat16>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}

/// values rounded to bf16 and back: the exact inputs the GPU sees, for the CPU reference.
inline std::vector<float> bf16_rounded(const std::vector<float>& values) {
  return to_f32(to_bf16(values));
}

/// Expects |gpu - cpu| <= abs_tol + rel_tol |cpu| elementwise (bf16 output: rel 2^-7).
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                         float abs_tol, float rel_tol, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int64_t reported = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const float tolerance = abs_tol + rel_tol * std::abs(cpu[i]);
    if (!(std::abs(gpu[i] - cpu[i]) <= tolerance) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
  EXPECT_EQ(reported, 0) << what << ": elements out of tolerance";
}

}  // namespace dhelix::cuda::testing
