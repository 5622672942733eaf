#pragma once
// Analytic solo time of a communication operator: the ring alpha-beta model with
// nccl-tests' bus-bandwidth factors (lib/link_cost.h has the arithmetic; docs/cost-model.md,
// hardware-figures.md):
//
//   all-reduce                      t = 2(n-1)·alpha + 2(n-1)/n · S/B
//   all-gather, reduce-scatter      t =  (n-1)·alpha +  (n-1)/n · S/B
//   all-to-all                      t =  (n-1)·alpha +  (n-1)/n · S/B
//   send/recv                       t =        alpha +            S/B
//
// S is Op.comm_bytes (the full gathered buffer per rank, as nccl-tests counts size), n the
// group size, B the bus bandwidth of the slowest link the group crosses and alpha that link's
// latency. Local groups use cluster.intra_node; cross-node groups pay the network latency and
// are limited by their share of the node's NICs (rails):
//
//   B_net = nic_busbw · nics_per_node · m / gpus_per_node,   m = group members per node
//
// because every group of a dimension runs in step: a node's GPUs belong to gpus_per_node / m
// groups of that dimension at once, which split the rails evenly. NCCL builds one ring per
// rail, so a group that owns every GPU of its nodes (cross-node TP 16 on 8-GPU nodes, m = 8)
// aggregates all rails: on H100 8 x 48 = 384 GB/s (nccl-tests: ~331 GB/s over 4 x 8 H100,
// ~192 over DGX-A100's 8 HDR NICs = 8 x 24); a group with one member per node (DP, PP,
// CP when TP fills the node) gets nics / gpus_per_node of them. Groups of other dimensions
// that cross at the same moment share the rails through the interference model (two
// network collectives progress at half speed each). A cross-node all-to-all gets at most one
// NIC's bandwidth per GPU (NCCL cannot aggregate NICs for it).
//
// Example: 8-GPU all-reduce on bus bandwidth B = 232 GB/s with alpha = 9 us reaches half of B
// when 2(n-1)/n · S/B = 2(n-1)·alpha, i.e. S = n·alpha·B = 8 · 9 us · 232 GB/s = 16.7 MB, where
// nccl-tests measures half of the peak on A100 and H100 (16-18 MB).

#include "lib/cluster_spec.h"
#include "lib/link_cost.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// The link a collective is limited by, as the alpha-beta model sees it.
struct CollectiveLink {
  double bus_bandwidth_gbps = 0;  ///< B, GB/s (1e9 bytes/s)
  double latency_us = 0;          ///< alpha, per ring step
  bool network = false;           ///< true when the traffic leaves the node
};

/// Bus bandwidth (GB/s) of the network share of one cross-node group of `group_size` ranks
/// spread over `nodes_spanned` nodes, all groups of its dimension running at once: the NIC
/// bus bandwidth times nics_per_node · m / gpus_per_node, m = group_size / nodes_spanned
/// (clamped to 1..gpus_per_node).
double cross_node_bus_bandwidth_gbps(const ClusterSpec& cluster, int64_t group_size,
                                     int64_t nodes_spanned);

/// The limiting link of a communication op on `cluster`.
CollectiveLink collective_link(const ClusterSpec& cluster, const Op& op);

/// Solo time of a communication op, microseconds (0 for a group of one rank).
double collective_time_us(const ClusterSpec& cluster, const Op& op);

/// Bytes per microsecond the op moves through its link while it runs at full speed
/// (= its bus bandwidth); the interference model charges memory traffic for it.
double collective_link_bytes_per_us(const ClusterSpec& cluster, const Op& op);

/// Bus bandwidth (GB/s) the model predicts for a collective of this kind, size and group on
/// `link`: what nccl-tests would report. Used to check the model against measurements.
double modelled_bus_bandwidth_gbps(OpKind kind, int64_t n, double bytes,
                                   const CollectiveLink& link);

}  // namespace dhelix
