// cuda_started_in_process (runtime/cuda/cuda_environment.h) against the real driver, in a
// process of its own: nothing may have started CUDA before main, the probe must not start
// it by asking, and it must see CUDA once the runtime has made its context. Exit 77
// (skipped) where no device answers; 1 with the step that failed.
#include <cuda_runtime.h>

#include <cstdio>

#include "runtime/cuda/cuda_environment.h"

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "cuda_start_probe: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  using dhelix::cuda::cuda_started_in_process;
  if (cuda_started_in_process()) return fail("CUDA reported started before any CUDA call");
  if (cuda_started_in_process()) return fail("asking started CUDA");
  // cudaFree(nullptr) makes the runtime initialise the driver and the primary context.
  if (cudaFree(nullptr) != cudaSuccess) {
    std::printf("skipped: no CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  if (!cuda_started_in_process()) return fail("CUDA not reported started after cudaFree(0)");
  std::printf("ok: the probe sees CUDA only once it has started\n");
  return 0;
}
