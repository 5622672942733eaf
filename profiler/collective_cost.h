#pragma once
// Analytic solo time of a communication operator: the ring alpha-beta model with
// nccl-tests' bus-bandwidth factors (docs/cost-model.md, hardware-figures.md):
//
//   all-reduce                      t = 2(n-1)·alpha + 2(n-1)/n · S/B
//   all-gather, reduce-scatter      t =  (n-1)·alpha +  (n-1)/n · S/B
//   all-to-all                      t =  (n-1)·alpha +  (n-1)/n · S/B
//   send/recv                       t =        alpha +            S/B
//
// S is Op.comm_bytes (the full gathered buffer per rank, as nccl-tests counts size), n the
// group size, B the bus bandwidth of the slowest link the group crosses and alpha that link's
// latency. Local groups use cluster.intra_node; cross-node groups are limited by each GPU's
// share of its node's NICs and pay the network latency; a cross-node all-to-all gets at most
// one NIC's bandwidth per GPU (NCCL cannot aggregate NICs for it).
//
// Example: 8-GPU all-reduce on bus bandwidth B = 232 GB/s with alpha = 9 us reaches half of B
// when 2(n-1)/n · S/B = 2(n-1)·alpha, i.e. S = n·alpha·B = 8 · 9 us · 232 GB/s = 16.7 MB, where
// nccl-tests measures half of the peak on A100 and H100 (16-18 MB).

#include "lib/cluster_spec.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// The link a collective is limited by, as the alpha-beta model sees it.
struct CollectiveLink {
  double bus_bandwidth_gbps = 0;  ///< B, GB/s (1e9 bytes/s)
  double latency_us = 0;          ///< alpha, per ring step
  bool network = false;           ///< true when the traffic leaves the node
};

/// nccl-tests' factor from algorithm bandwidth (size / time) to bus bandwidth for a
/// collective of `n` ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
/// (n-1)/n; send/recv 1. DHELIX_CHECKs that `kind` is communication.
double bus_bandwidth_factor(OpKind kind, int64_t n);

/// Ring steps that each pay alpha: all-reduce 2(n-1), send/recv 1, others n-1.
int64_t latency_steps(OpKind kind, int64_t n);

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
