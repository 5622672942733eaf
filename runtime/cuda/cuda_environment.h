#pragma once
// The environment CUDA reads once, when it starts, and whether dhelix set it in time.
//
// CUDA_MODULE_LOADING=LAZY (a module loads when one of its kernels is first used) and
// CUDA_DEVICE_MAX_CONNECTIONS=32 (a hardware queue per stream: device_streams.h) take
// effect only if they are in the environment before CUDA starts in the process. A
// CUDA-aware MPI (Open MPI over UCX with CUDA transports) may start CUDA inside MPI_Init,
// so dhelix-run and dhelix-profile set them before MPI_Init (tools/cuda_start.h). Reading
// the variable back afterwards proves nothing: it returns dhelix's own value whether or not
// CUDA saw it. So the setting records whether CUDA had already started at that moment
// (the driver answering a query without being initialised by it), and the value in effect
// is then the one the process started with, which the stream check
// (check_device_max_connections) counts against.
//
// NCCL_RUNTIME_CONNECT=0 is set alongside: NCCL 2.22 and later connect each algorithm of a
// communicator lazily, on the first collective that picks it; with 0 they all connect in
// ncclCommInit, at set-up, so no connection handshake can happen inside iteration 1 while
// pipeline receives spin on the GPU, whatever size NCCL's tuning meets there (the warm-up,
// comm_warmup.h, covers the sizes an iteration uses; this covers what it may miss). The
// cost: buffers for algorithms never used, and a slower set-up; NCCL_RUNTIME_CONNECT=1
// keeps the lazy connection (docs/gpu.md, "Environment settings"). NCCL reads it when
// dhelix creates its first communicator, long after this, so it is always in effect.
//
// Why LAZY, set rather than left to the CUDA version's default (EAGER before 12.2): EAGER
// was chosen so that no kernel would load inside iteration 1 while receives spin
// (docs/gpu.md, "Review", point 1), but it loads every module of the process, all of
// cuBLAS's and cuDNN's kernels included, with the context: tens of seconds and gigabytes
// of device memory per rank. The set-up already loads what an iteration launches before
// any receive (device_setup.h): every dhelix kernel explicitly, each GEMM call of the
// model once, cuDNN's plans for the job's shape, and NCCL's kernels (ncclCommInit loads
// them; the warm-up runs every operation at every size class). EAGER stays one export away:
// CUDA_MODULE_LOADING=EAGER in the job script (docs/gpu.md, "Environment settings").
//
// A value the user set is kept: it was in the environment when the process started, so
// CUDA saw it whenever it started.

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dhelix::cuda {

/// One environment variable CUDA reads when it starts, as dhelix left it.
struct EnvironmentSetting {
  std::string name;
  std::string value;           ///< as the environment holds it now
  bool set_by_dhelix = false;  ///< false: the user's own value, kept
  /// false when dhelix set it after CUDA had started in the process: CUDA kept what the
  /// process started with (`started_with`).
  bool in_effect = true;
  std::optional<std::string> started_with;  ///< the value before dhelix (nullopt: unset)
};

/// For each variable of the file comment unset in `get` (nullptr = unset), calls set(name,
/// value): CUDA_MODULE_LOADING, CUDA_DEVICE_MAX_CONNECTIONS, NCCL_RUNTIME_CONNECT, in that
/// order. `cuda_started`: whether CUDA had started in the process before this call (CUDA's
/// two settings then are not in effect).
std::vector<EnvironmentSetting> prepare_cuda_environment(
    const std::function<const char*(const char*)>& get,
    const std::function<void(const char*, const char*)>& set, bool cuda_started);

/// The value of `name` CUDA works with: the setting's when it took effect, else the one the
/// process started with; nullopt when unset (CUDA's default) or not among `settings`.
std::optional<std::string> value_in_effect(const std::vector<EnvironmentSetting>& settings,
                                           const std::string& name);

/// One sentence per setting dhelix made too late (empty when all are in effect), naming
/// the variable, what CUDA uses instead and the fix (export it in the job script).
std::vector<std::string> late_setting_notes(const std::vector<EnvironmentSetting>& settings);

/// Whether CUDA has started in this process: the CUDA driver library is loaded and answers
/// cuDeviceGetCount without CUDA_ERROR_NOT_INITIALIZED. Starts nothing: the library is
/// looked up with RTLD_NOLOAD, never loaded.
bool cuda_started_in_process();

/// The process's settings: the first call prepares them (real environment, real probe);
/// every later call returns the same. dhelix-run and dhelix-profile call it before
/// MPI_Init; the CUDA engine calls it again before its first CUDA call, which then only
/// reads what the first call recorded.
const std::vector<EnvironmentSetting>& process_cuda_environment();

}  // namespace dhelix::cuda
