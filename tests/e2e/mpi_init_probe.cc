// A library preloaded (LD_PRELOAD) into dhelix-run and dhelix-profile by
// cuda_environment_order_test.sh: it takes MPI_Init_thread's place, prints the environment
// CUDA reads when it starts as it stands at that moment, and calls the real one (PMPI).
// A CUDA-aware MPI may start CUDA inside MPI_Init, so what it prints is what CUDA would see
// (runtime/cuda/cuda_environment.h).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>

extern "C" int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  for (const char* name :
       {"CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_RUNTIME_CONNECT"}) {
    const char* value = std::getenv(name);
    std::fprintf(stderr, "mpi-init-probe: %s=%s\n", name, value == nullptr ? "<unset>" : value);
  }
  return PMPI_Init_thread(argc, argv, required, provided);
}
