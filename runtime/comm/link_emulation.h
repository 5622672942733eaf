#pragma once
// What `--emulate-link` asks for: a modelled link per process-group kind, on which the CPU
// runtime's collectives and pipeline transfers complete when the link would have finished
// them (runtime/comm/emulated_link.h). dhelix-run and `dhelix-profile --backend cpu` take
// the same spelling, so a profile and the runs planned from it see the same link:
//
//   --emulate-link [KIND=]RATE[@LATENCY]      (repeatable)
//
//   KIND     tp, cp, ep, dp or pp; left out: every kind without a setting of its own
//   RATE     bits per second per direction, in tc's units: 500mbit, 2gbit, 100kbit
//            (1000-based: 1gbit = 125 MB/s), the bus bandwidth B of lib/link_cost.h
//   LATENCY  alpha of one ring step: 20us, 0.5ms (default 0us)
//
//   --emulate-link 2gbit@20us --emulate-link pp=1gbit     tp, cp, ep, dp at 2 Gbit/s with
//                                                          20 us; pp at 1 Gbit/s with 0 us
//
// A kind with no setting (and no KIND-less setting) runs on the real transport as before.
// This demonstrates the runtime's schedule on a modelled link, not a network: the bytes
// move through shared memory at once and the call returns when the model says the link
// would be done.

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "lib/parallel_spec.h"

namespace dhelix::rt {

/// One emulated link's figures.
struct LinkRate {
  double bus_bandwidth_gbps = 0;  ///< B, GB/s (1e9 bytes/s) per direction
  double latency_us = 0;          ///< alpha per ring step
  std::string text;               ///< as the user wrote it, normalised: "2gbit@20us"
};

class LinkEmulation {
 public:
  /// No link emulated.
  LinkEmulation() = default;
  /// Reads the values of `flag` (see the file comment). Throws Error(kInvalidInput) naming
  /// the flag, the value and the rule it breaks, e.g. "--emulate-link: 'tp=2gb' has rate
  /// '2gb': write bits per second as tc does: 500mbit, 2gbit, 100kbit", and for a kind
  /// given twice.
  static LinkEmulation parse(const std::vector<std::string>& values,
                             const std::string& flag = "--emulate-link");

  /// The link of `kind`'s groups, or null when that kind is not emulated.
  const LinkRate* rate(ParallelDim kind) const;
  /// Whether any kind is emulated.
  bool enabled() const;
  /// "tp 2gbit@20us, cp 2gbit@20us, ..." in kParallelDimNames order, emulated kinds only;
  /// "" when none.
  std::string describe() const;
  /// {"tp": {"rate": "2gbit", "bus_bandwidth_gbps": 0.25, "latency_us": 20}, ...,
  ///  "note": "..."}: for a trace's or a profile's metadata.
  OrderedJson to_json() const;

 private:
  std::array<std::optional<LinkRate>, kParallelDimNames.names.size()> rates_;
};

}  // namespace dhelix::rt
