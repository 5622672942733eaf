#pragma once
// The alpha-beta time of one collective on one link: the arithmetic the model backend
// prices every communication op with (profiler/collective_cost.h, which picks the link),
// and the emulated link of the CPU runtime (runtime/comm/emulated_link.h) completes its
// transfers by, so that the two agree by construction on what a transfer costs.
//
//   all-reduce                      t = 2(n-1)·alpha + 2(n-1)/n · S/B
//   all-gather, reduce-scatter      t =  (n-1)·alpha +  (n-1)/n · S/B
//   all-to-all                      t =  (n-1)·alpha +  (n-1)/n · S/B
//   send/recv                       t =        alpha +            S/B
//
// S is the full buffer per rank as nccl-tests counts size (all-gather: the gathered
// buffer; reduce-scatter: the input; send/recv: the bytes sent), n the group size, B the
// bus bandwidth and alpha the latency of one ring step. (n-1)/n · S is what each rank puts
// on its link in a ring all-gather or reduce-scatter: n-1 steps of S/n bytes.
//
// Example: a 2-rank all-gather of 1 MB (each rank contributes 512 KB) on B = 0.25 GB/s
// (2 Gbit/s) with alpha = 20 us: 1 · 20 us + 1/2 · 1e6 B / 250 B/us = 20 + 2000 = 2020 us.

#include <cstdint>

#include "lib/op_catalogue.h"

namespace dhelix {

/// nccl-tests' factor from algorithm bandwidth (size / time) to bus bandwidth for a
/// collective of `n` ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
/// (n-1)/n; send/recv 1. DHELIX_CHECKs that `kind` is communication.
double bus_bandwidth_factor(OpKind kind, int64_t n);

/// Ring steps that each pay alpha: all-reduce 2(n-1), send/recv 1, others n-1.
int64_t latency_steps(OpKind kind, int64_t n);

/// t above, microseconds, for `bytes` = S on a link of `bus_bandwidth_gbps` (GB/s, 1e9
/// bytes/s) and `latency_us`; 0 for a group of one rank.
double link_time_us(OpKind kind, int64_t n, double bytes, double bus_bandwidth_gbps,
                    double latency_us);

}  // namespace dhelix
