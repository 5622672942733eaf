#include "profiler/cuda/cuda_device.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_environment.h"

namespace dhelix::cuda_profile {
namespace {

// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// NCCL 2.9 and later encode versions as 10000 * major + 100 * minor + patch.
std::string nccl_version_text(int version) {
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

}  // namespace

void throw_no_device(const std::string& reason) {
  throw Error(ErrorCode::kUnsupported,
              "--backend cuda: no CUDA device found (cudaGetDeviceCount: " + reason + ")");
}

int visible_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // Reset the last-error state, so that a later cudaGetLastError does not report it again.
    (void)cudaGetLastError();
    throw_no_device(cudaGetErrorString(status));
  }
  if (count == 0) throw_no_device("0 devices");
  return count;
}

DeviceInfo use_device(int device) {
  DHELIX_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  DHELIX_CUDA(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.device = device;
  info.name = prop.name;
  char bus_id[32] = {};
  DHELIX_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
  info.pci_bus_id = bus_id;
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.sm_count = prop.multiProcessorCount;
  info.compute_capability = prop.major * 10 + prop.minor;
  int driver = 0, runtime = 0, nccl = 0, cublas = 0;
  DHELIX_CUDA(cudaDriverGetVersion(&driver));
  DHELIX_CUDA(cudaRuntimeGetVersion(&runtime));
  DHELIX_NCCL(ncclGetVersion(&nccl));
  DHELIX_CUBLAS(cublasGetProperty(MAJOR_VERSION, &cublas));
  int minor = 0, patch = 0;
  DHELIX_CUBLAS(cublasGetProperty(MINOR_VERSION, &minor));
  DHELIX_CUBLAS(cublasGetProperty(PATCH_LEVEL, &patch));
  info.driver = cuda_version_text(driver);
  info.runtime = cuda_version_text(runtime);
  info.nccl = nccl_version_text(nccl);
  info.cublas = std::to_string(cublas) + "." + std::to_string(minor) + "." + std::to_string(patch);
  return info;
}

OrderedJson device_to_json(const DeviceInfo& info) {
  OrderedJson json = OrderedJson::object();
  json["name"] = info.name;
  json["compute_capability"] = std::to_string(info.compute_capability / 10) + "." +
                               std::to_string(info.compute_capability % 10);
  json["sms"] = info.sm_count;
  json["memory_bytes"] = info.memory_bytes;
  json["l2_bytes"] = info.l2_bytes;
  json["driver_cuda"] = info.driver;
  json["cuda_runtime"] = info.runtime;
  json["nccl"] = info.nccl;
  json["cublas"] = info.cublas;
  return json;
}

OrderedJson environment_to_json() {
  OrderedJson json = OrderedJson::object();
  for (const char* name :
       {"CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_NCHANNELS", "NCCL_NTHREADS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME", "NCCL_NET_GDR_LEVEL", "NCCL_P2P_LEVEL", "NCCL_BUFFSIZE"}) {
    const char* value = std::getenv(name);
    json[name] = value == nullptr ? "<unset>" : value;
  }
  // CUDA's two start-up settings as CUDA works with them: dhelix's own value reads back
  // even when CUDA had started before it was set (runtime/cuda/cuda_environment.h).
  const std::vector<cuda::EnvironmentSetting>& settings = cuda::process_cuda_environment();
  for (const cuda::EnvironmentSetting& setting : settings) {
    const std::optional<std::string> value = cuda::value_in_effect(settings, setting.name);
    json[setting.name] = value.value_or("<unset>");
  }
  return json;
}

}  // namespace dhelix::cuda_profile
