// The delay kernel of dhelix-run --jitter-us on GPUs (runtime/exec/jitter.h): one thread
// that holds its stream for a given time, so that the ops behind it start later and the
// streams' relative timing is shaken the way the CPU interpreter's sleeps shake it.

#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/launch_util.cuh"

namespace dhelix::cuda {
namespace {

// %globaltimer counts nanoseconds (PTX ISA, "Special registers"); __nanosleep (sm_70 and
// later) keeps the waiting thread from competing for issue slots with real work.
__device__ uint64_t global_timer_ns() {
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void delay_kernel(uint64_t duration_ns) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < duration_ns) __nanosleep(1000);
}

}  // namespace

std::vector<KernelEntry> delay_kernels() {
  return {{"delay_kernel", reinterpret_cast<const void*>(&delay_kernel)}};
}

void delay(int64_t microseconds, cudaStream_t stream) {
  if (microseconds <= 0) return;
  delay_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds) * 1000u);
  DHELIX_CUDA_LAUNCHED();
}

}  // namespace dhelix::cuda
