#include "lib/link_cost.h"

#include "lib/error.h"

namespace dhelix {

double bus_bandwidth_factor(OpKind kind, int64_t n) {
  DHELIX_CHECK(is_communication(kind) && n >= 1);
  const double ranks = static_cast<double>(n);
  switch (kind) {
    case OpKind::kAllReduce:
      return 2.0 * (ranks - 1) / ranks;
    case OpKind::kSendRecv:
      return 1.0;
    default:
      return (ranks - 1) / ranks;
  }
}

int64_t latency_steps(OpKind kind, int64_t n) {
  DHELIX_CHECK(is_communication(kind) && n >= 1);
  switch (kind) {
    case OpKind::kAllReduce:
      return 2 * (n - 1);
    case OpKind::kSendRecv:
      return 1;
    default:
      return n - 1;
  }
}

double link_time_us(OpKind kind, int64_t n, double bytes, double bus_bandwidth_gbps,
                    double latency_us) {
  if (n <= 1) return 0;
  const double bytes_per_us = bus_bandwidth_gbps * 1e9 / 1e6;
  return static_cast<double>(latency_steps(kind, n)) * latency_us +
         bus_bandwidth_factor(kind, n) * bytes / bytes_per_us;
}

}  // namespace dhelix
