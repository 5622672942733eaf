#include "profiler/interference.h"

#include <algorithm>
#include <cmath>

#include "lib/error.h"
#include "lib/profile.h"
#include "profiler/collective_cost.h"
#include "profiler/compute_cost.h"

namespace dhelix {
namespace {

// Share of the usable memory bandwidth an op pulls while it runs at full speed.
double memory_demand(const ClusterSpec& cluster, const Op& op) {
  if (is_communication(op.kind)) {
    const double traffic =
        cluster.nccl_memory_traffic_factor * collective_link_bytes_per_us(cluster, op);
    return std::min(0.9, traffic / memory_bytes_per_us(cluster.gpu));
  }
  const KernelCost cost = compute_kernel_cost(cluster.gpu, op);
  const double body = std::max(cost.compute_us, cost.memory_us);
  return body <= 0 ? 0 : cost.memory_us / body;
}

// SMs a compute kernel can keep busy: its tiles for a GEMM, all of them otherwise.
int64_t sm_demand(const GpuSpec& gpu, const KernelCost& cost) {
  return cost.tiles > 0 ? std::min(cost.tiles, gpu.sm_count) : gpu.sm_count;
}

// Rate of a compute kernel that gets `sms` SMs and whose memory traffic is slowed by
// `memory_slowdown` (>= 1), times `penalty` (>= 1) for contention.
double compute_rate(const GpuSpec& gpu, const KernelCost& cost, int64_t sms, double memory_slowdown,
                    double penalty) {
  const double solo = kernel_time_us(gpu, cost);
  const double slowed = kernel_time_us(
      gpu, cost, {.sms = std::max<int64_t>(sms, 1), .memory_fraction = 1.0 / memory_slowdown});
  return solo / (slowed * penalty);
}

bool is_attention_backward(const Op& op) {
  return op.kind == OpKind::kAttention && op.pass == Pass::kBackward;
}

CoRunRates compute_x_compute(const ClusterSpec& cluster, const Op& a, const Op& b) {
  const GpuSpec& gpu = cluster.gpu;
  const KernelCost cost_a = compute_kernel_cost(gpu, a);
  const KernelCost cost_b = compute_kernel_cost(gpu, b);
  const int64_t want_a = sm_demand(gpu, cost_a);
  const int64_t want_b = sm_demand(gpu, cost_b);
  int64_t sms_a = want_a;
  int64_t sms_b = want_b;
  double penalty = 1.0;
  if (want_a + want_b > gpu.sm_count) {
    penalty += (is_attention_backward(a) || is_attention_backward(b)) ? kAttentionBackwardContention
                                                                      : kComputeContention;
    if (gpu.sm_count >= 2) {
      // The block scheduler hands out SMs roughly in proportion to the blocks waiting.
      sms_a = std::llround(static_cast<double>(gpu.sm_count) * static_cast<double>(want_a) /
                           static_cast<double>(want_a + want_b));
      sms_a = std::clamp<int64_t>(sms_a, 1, gpu.sm_count - 1);
      sms_b = gpu.sm_count - sms_a;
    } else {
      // One SM cannot be split: both kernels keep it and take turns, each at half speed.
      sms_a = sms_b = 1;
      penalty *= 2;
    }
  }
  const double slowdown = std::max(1.0, memory_demand(cluster, a) + memory_demand(cluster, b));
  return {compute_rate(gpu, cost_a, sms_a, slowdown, penalty),
          compute_rate(gpu, cost_b, sms_b, slowdown, penalty)};
}

}  // namespace

MemoryShares collective_memory_shares(double compute_demand, double collective_demand) {
  DHELIX_CHECK(compute_demand >= 0 && collective_demand >= 0);
  if (compute_demand + collective_demand <= 1.0) return {compute_demand, collective_demand};
  // Max-min fairness: a demand below half the bandwidth is served in full, the other
  // demand gets what is left; two demands above half get half each.
  const double collective = std::min(collective_demand, std::max(0.5, 1.0 - compute_demand));
  const double compute = std::min(compute_demand, std::max(0.5, 1.0 - collective_demand));
  return {compute, collective};
}

namespace {

// Rates of (compute, comm). Memory bandwidth is shared max-min (collective_memory_shares).
CoRunRates compute_x_comm(const ClusterSpec& cluster, const Op& compute, const Op& comm) {
  const GpuSpec& gpu = cluster.gpu;
  const int64_t nccl_sms =
      comm.scope == GroupScope::kLocal ? cluster.nccl_sms_intra_node : cluster.nccl_sms_inter_node;
  const double compute_demand = memory_demand(cluster, compute);
  const double comm_demand = memory_demand(cluster, comm);
  const MemoryShares shares = collective_memory_shares(compute_demand, comm_demand);
  const double compute_slowdown =
      compute_demand > 0 ? std::max(1.0, compute_demand / shares.compute) : 1.0;
  const double comm_rate = comm_demand > 0 ? std::min(1.0, shares.collective / comm_demand) : 1.0;
  const KernelCost cost = compute_kernel_cost(gpu, compute);
  return {compute_rate(gpu, cost, gpu.sm_count - nccl_sms, compute_slowdown, 1.0), comm_rate};
}

// Share of the GPU's PCIe link a cross-node collective needs (its NIC traffic crosses it);
// 0 where the intra-node link is not PCIe.
double pcie_demand_of_network(const ClusterSpec& cluster, const Op& cross) {
  if (cluster.intra_node.kind != LinkKind::kPcie) return 0;
  if (cluster.intra_node.bus_bandwidth_gbps <= 0) return 0;
  return collective_link(cluster, cross).bus_bandwidth_gbps / cluster.intra_node.bus_bandwidth_gbps;
}

CoRunRates comm_x_comm(const ClusterSpec& cluster, const Op& a, const Op& b) {
  const double memory = memory_demand(cluster, a) + memory_demand(cluster, b);
  double link = 0;
  if (a.scope == b.scope) {
    link = 2.0;  // both want all of the same link
  } else {
    const Op& cross = a.scope == GroupScope::kCrossNode ? a : b;
    link = 1.0 + pcie_demand_of_network(cluster, cross);
  }
  const double rate = 1.0 / std::max({1.0, memory, link});
  return {rate, rate};
}

}  // namespace

double op_time_us(const ClusterSpec& cluster, const Op& op) {
  return is_communication(op.kind) ? collective_time_us(cluster, op)
                                   : compute_time_us(cluster.gpu, op);
}

CoRunRates co_run_rates(const ClusterSpec& cluster, const Op& a, const Op& b) {
  const bool comm_a = is_communication(a.kind);
  const bool comm_b = is_communication(b.kind);
  if (!comm_a && !comm_b) return compute_x_compute(cluster, a, b);
  if (comm_a && comm_b) return comm_x_comm(cluster, a, b);
  if (comm_b) return compute_x_comm(cluster, a, b);
  const CoRunRates swapped = compute_x_comm(cluster, b, a);
  return {swapped.rate_b, swapped.rate_a};
}

CoRun co_run_from_rates(double time_a_us, double time_b_us, CoRunRates rates) {
  DHELIX_CHECK(time_a_us >= 0 && time_b_us >= 0 && rates.rate_a > 0 && rates.rate_b > 0);
  CoRun run;
  run.rates = rates;
  const double alone_a = time_a_us / rates.rate_a;  // finish of a if b never ended
  const double alone_b = time_b_us / rates.rate_b;
  if (alone_a <= alone_b) {
    run.finish_a_us = alone_a;
    run.finish_b_us = time_b_us + alone_a * (1 - rates.rate_b);  // exact when rate_b is 1
  } else {
    run.finish_b_us = alone_b;
    run.finish_a_us = time_a_us + alone_b * (1 - rates.rate_a);
  }
  run.makespan_us = std::max(run.finish_a_us, run.finish_b_us);
  run.oef = overlap_effectiveness(time_a_us, time_b_us, run.makespan_us);
  return run;
}

CoRun co_run(const ClusterSpec& cluster, const Op& a, const Op& b) {
  return co_run_from_rates(op_time_us(cluster, a), op_time_us(cluster, b),
                           co_run_rates(cluster, a, b));
}

}  // namespace dhelix
