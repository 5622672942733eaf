#pragma once
// The hardware a job runs on: one GPU type, nodes of `gpus_per_node` GPUs joined by an
// intra-node link, and nodes joined by NICs. Shipped presets (cluster_presets.h) describe
// the paper's testbeds; every figure cites a source and can be overridden in a cluster file.

#include <cstdint>
#include <string>

namespace dhelix {

enum class LinkKind { kNvLink, kPcie, kInfiniBand, kEthernet };
const char* link_kind_name(LinkKind kind);  ///< "nvlink", "pcie", "infiniband", "ethernet"

struct GpuSpec {
  std::string name;                  ///< "A40", "H100-SXM", ...
  double peak_bf16_tflops = 0;       ///< dense bf16 tensor-core peak, TFLOP/s
  int64_t memory_bytes = 0;          ///< device memory
  double memory_bandwidth_gbps = 0;  ///< HBM/GDDR bandwidth, GB/s (1e9 bytes/s)
  int64_t sm_count = 0;
  /// Fraction of peak a large, well-shaped GEMM reaches (smaller shapes lose more; see
  /// docs/cost-model.md).
  double gemm_efficiency = 0.8;
  /// Fraction of peak flash-style attention reaches (forward; backward is modelled from it).
  double attention_efficiency = 0.5;
  /// Fraction of memory_bandwidth_gbps memory-bound kernels reach.
  double memory_efficiency = 0.85;
  std::string source;  ///< where the figures come from
};

/// One class of link as seen by one GPU.
struct LinkSpec {
  LinkKind kind = LinkKind::kPcie;
  double bandwidth_gbps = 0;      ///< per GPU, per direction, GB/s: the hardware figure
  double bus_bandwidth_gbps = 0;  ///< large-message bus bandwidth NCCL achieves, GB/s
  double latency_us = 0;          ///< per-hop latency (alpha), microseconds
  std::string source;
};

struct ClusterSpec {
  std::string name;         ///< preset short name or the file's "name"
  std::string source_file;  ///< file it was read from ("" for a preset)
  GpuSpec gpu;
  int64_t gpus_per_node = 8;
  /// Nodes in the cluster; 0 means "as many as the job needs" (world size / gpus_per_node).
  int64_t num_nodes = 0;
  LinkSpec intra_node;        ///< GPU-to-GPU inside a node
  LinkSpec inter_node;        ///< one NIC
  int64_t nics_per_node = 1;  ///< NICs a node's GPUs share for cross-node traffic
  /// SMs a running NCCL collective occupies (one block per channel), over the intra-node
  /// link and over the network; a co-running compute kernel loses them.
  int64_t nccl_sms_intra_node = 8;
  int64_t nccl_sms_inter_node = 4;
  /// Bytes NCCL moves through device memory per byte it sends: it competes with
  /// memory-bound kernels for bandwidth.
  double nccl_memory_traffic_factor = 2.5;

  /// Cross-node bandwidth available to one GPU when all GPUs of a node send at once, GB/s.
  double inter_node_bandwidth_per_gpu_gbps() const {
    return gpus_per_node == 0 ? 0
                              : inter_node.bus_bandwidth_gbps * static_cast<double>(nics_per_node) /
                                    static_cast<double>(gpus_per_node);
  }
};

}  // namespace dhelix
