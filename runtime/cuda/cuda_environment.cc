#include "runtime/cuda/cuda_environment.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <utility>

namespace dhelix::cuda {
namespace {

// The most CUDA_DEVICE_MAX_CONNECTIONS CUDA accepts.
constexpr const char* kMostConnections = "32";
// CUresult's CUDA_SUCCESS (cuda.h; not included: this file builds without the toolkit).
constexpr int kCudaSuccess = 0;

// What CUDA uses for a variable the process started without.
std::string cuda_default_of(const std::string& name) {
  if (name == "CUDA_DEVICE_MAX_CONNECTIONS") return "its default of 8 hardware queues";
  return "its default (lazy loading since CUDA 12.2, eager before)";
}

}  // namespace

std::vector<EnvironmentSetting> prepare_cuda_environment(
    const std::function<const char*(const char*)>& get,
    const std::function<void(const char*, const char*)>& set, bool cuda_started) {
  struct Default {
    const char* name;
    const char* value;
    bool read_when_cuda_starts;  // else when dhelix creates its first NCCL communicator
  };
  std::vector<EnvironmentSetting> settings;
  for (const Default& d : {Default{"CUDA_MODULE_LOADING", "LAZY", true},
                           Default{"CUDA_DEVICE_MAX_CONNECTIONS", kMostConnections, true},
                           Default{"NCCL_RUNTIME_CONNECT", "0", false}}) {
    const char* current = get(d.name);
    if (current != nullptr) {
      settings.push_back({.name = d.name, .value = current, .started_with = current});
      continue;
    }
    set(d.name, d.value);
    settings.push_back({.name = d.name,
                        .value = d.value,
                        .set_by_dhelix = true,
                        .in_effect = !(cuda_started && d.read_when_cuda_starts),
                        .started_with = std::nullopt});
  }
  return settings;
}

std::optional<std::string> value_in_effect(const std::vector<EnvironmentSetting>& settings,
                                           const std::string& name) {
  for (const EnvironmentSetting& setting : settings) {
    if (setting.name != name) continue;
    if (setting.in_effect) return setting.value;
    return setting.started_with;
  }
  return std::nullopt;
}

std::vector<std::string> late_setting_notes(const std::vector<EnvironmentSetting>& settings) {
  std::vector<std::string> notes;
  for (const EnvironmentSetting& setting : settings) {
    if (setting.in_effect) continue;
    notes.push_back(fmt::format(
        "CUDA had already started in this process (a CUDA-aware MPI, or a library loaded "
        "before dhelix) when dhelix set {}={}, so CUDA uses {}; export {}={} in the job "
        "script (mpirun -x) so that CUDA sees it when it starts",
        setting.name, setting.value, cuda_default_of(setting.name), setting.name, setting.value));
  }
  return notes;
}

bool cuda_started_in_process() {
  // RTLD_NOLOAD: a handle only when the driver library is already in the process. Nothing
  // can have started CUDA without loading it.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return false;
  using DeviceGetCount = int (*)(int*);
  const auto count = reinterpret_cast<DeviceGetCount>(dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  // Before cuInit every driver call answers CUDA_ERROR_NOT_INITIALIZED and initialises
  // nothing; after it, cuDeviceGetCount succeeds.
  const bool started = count != nullptr && count(&devices) == kCudaSuccess;
  dlclose(driver);
  return started;
}

const std::vector<EnvironmentSetting>& process_cuda_environment() {
  static std::once_flag once;
  static std::vector<EnvironmentSetting> settings;
  std::call_once(once, [] {
    const bool started = cuda_started_in_process();
    settings = prepare_cuda_environment(
        [](const char* name) { return std::getenv(name); },
        [](const char* name, const char* value) { static_cast<void>(setenv(name, value, 0)); },
        started);
  });
  return settings;
}

}  // namespace dhelix::cuda
