#pragma once
// The shipped cluster presets: the DHelix paper's testbeds (section 6.1) and an H200 node.
// A preset describes one node type and its network; num_nodes is 0 ("as many as the job
// needs"). Every figure carries a `source` string; docs/presets.md tabulates them.
//
//   a40  : 8 x A40 48 GB per node on PCIe 4.0, one 100 Gb/s InfiniBand NIC per node
//   a800 : 8 x A800 SXM 80 GB on NVLink (400 GB/s), 4 x 200 Gb/s InfiniBand per node
//   h100 : 8 x H100 SXM 80 GB on NVLink4 (900 GB/s), 8 x 400 Gb/s InfiniBand per node
//   h200 : as h100 with 141 GB of HBM3e at 4.8 TB/s
//
// The lookup by name (with "did you mean") is cluster_preset() in cluster_reader.h.

#include <optional>
#include <string>

#include "lib/cluster_spec.h"

namespace dhelix {

/// The preset of that short name, or nothing.
std::optional<ClusterSpec> find_cluster_preset(const std::string& name);

}  // namespace dhelix
