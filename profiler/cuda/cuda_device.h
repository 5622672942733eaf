#pragma once
// The GPU a profiling rank uses and what the profile records about it and its software.

#include <cstdint>
#include <string>

#include "lib/json_reader.h"

namespace dhelix::cuda_profile {

/// The no-device error, thrown before anything else when the CUDA runtime reports no GPU:
/// Error(kUnsupported) "--backend cuda: no CUDA device found (cudaGetDeviceCount: <CUDA's
/// error text, or "0 devices">)".
[[noreturn]] void throw_no_device(const std::string& reason);

/// Number of visible CUDA devices; throw_no_device when cudaGetDeviceCount fails or finds
/// none.
int visible_device_count();

/// What a rank's GPU and software are.
struct DeviceInfo {
  int device = 0;
  std::string name;          ///< "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;    ///< "0000:1B:00.0"
  int64_t l2_bytes = 0;      ///< cudaDeviceProp::l2CacheSize
  int64_t memory_bytes = 0;  ///< cudaDeviceProp::totalGlobalMem
  int sm_count = 0;
  int compute_capability = 0;  ///< 90 for sm_90
  std::string driver;          ///< CUDA version the driver supports, "12.4"
  std::string runtime;         ///< CUDA runtime version, "12.4"
  std::string nccl;            ///< NCCL library version, "2.21.5"
  std::string cublas;          ///< cuBLAS library version, "12.4.5"
};

/// Makes `device` current (cudaSetDevice) and describes it.
DeviceInfo use_device(int device);

/// The device block of a profile's meta.measurement: name, compute capability, SMs,
/// memory, L2, driver, runtime, NCCL and cuBLAS versions.
OrderedJson device_to_json(const DeviceInfo& info);

/// The environment settings that change what NCCL and the CUDA streams do, as set for this
/// process ("<unset>" when not set; CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS as
/// in effect, cuda_environment.h): those two, NCCL_MAX_NCHANNELS,
/// NCCL_MIN_NCHANNELS, NCCL_NTHREADS, NCCL_ALGO, NCCL_PROTO, NCCL_IB_HCA, NCCL_SOCKET_IFNAME,
/// NCCL_NET_GDR_LEVEL, NCCL_P2P_LEVEL, NCCL_BUFFSIZE.
OrderedJson environment_to_json();

}  // namespace dhelix::cuda_profile
