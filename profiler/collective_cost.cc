#include "profiler/collective_cost.h"

#include <algorithm>

#include "lib/error.h"

namespace dhelix {

double cross_node_bus_bandwidth_gbps(const ClusterSpec& cluster, int64_t group_size,
                                     int64_t nodes_spanned) {
  DHELIX_CHECK(group_size >= 1 && nodes_spanned >= 1 && cluster.gpus_per_node >= 1);
  // Placement spreads a group evenly: m members on each node it spans. All groups of one
  // dimension run in step, so the node's GPUs belong to gpus_per_node / m groups at once and
  // each group's ring gets m / gpus_per_node of the node's rails.
  const int64_t members_per_node =
      std::clamp<int64_t>(group_size / nodes_spanned, 1, cluster.gpus_per_node);
  const double rails = static_cast<double>(cluster.nics_per_node) *
                       static_cast<double>(members_per_node) /
                       static_cast<double>(cluster.gpus_per_node);
  return cluster.inter_node.bus_bandwidth_gbps * rails;
}

CollectiveLink collective_link(const ClusterSpec& cluster, const Op& op) {
  DHELIX_CHECK(is_communication(op.kind));
  CollectiveLink link;
  if (op.scope == GroupScope::kLocal) {
    link.bus_bandwidth_gbps = cluster.intra_node.bus_bandwidth_gbps;
    link.latency_us = cluster.intra_node.latency_us;
    return link;
  }
  double network = cross_node_bus_bandwidth_gbps(cluster, op.group_size, op.nodes_spanned);
  if (op.kind == OpKind::kAllToAll)
    network = std::min(cluster.inter_node_bandwidth_per_gpu_gbps(),
                       cluster.inter_node.bus_bandwidth_gbps);
  link.bus_bandwidth_gbps = std::min(network, cluster.intra_node.bus_bandwidth_gbps);
  link.latency_us = std::max(cluster.inter_node.latency_us, cluster.intra_node.latency_us);
  link.network = true;
  return link;
}

double collective_time_us(const ClusterSpec& cluster, const Op& op) {
  const CollectiveLink link = collective_link(cluster, op);
  return link_time_us(op.kind, op.group_size, static_cast<double>(op.comm_bytes),
                      link.bus_bandwidth_gbps, link.latency_us);
}

double collective_link_bytes_per_us(const ClusterSpec& cluster, const Op& op) {
  if (op.group_size <= 1) return 0;
  return collective_link(cluster, op).bus_bandwidth_gbps * 1e9 / 1e6;
}

double modelled_bus_bandwidth_gbps(OpKind kind, int64_t n, double bytes,
                                   const CollectiveLink& link) {
  const double time_us = link_time_us(kind, n, bytes, link.bus_bandwidth_gbps, link.latency_us);
  if (time_us <= 0) return 0;
  return bus_bandwidth_factor(kind, n) * bytes / time_us * 1e6 / 1e9;
}

}  // namespace dhelix
