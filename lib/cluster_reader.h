#pragma once
// Cluster descriptions: shipped presets (a40, a800, h100, h200) and cluster files
// (schemas/cluster.schema.json) that may start from a preset ("base") and override any figure.

#include <string>
#include <vector>

#include "lib/cluster_spec.h"
#include "lib/json_reader.h"

namespace dhelix {

/// Short names of the shipped presets, in a stable order.
std::vector<std::string> cluster_preset_names();

/// A shipped preset by short name; Error(kInvalidInput) with a "did you mean" otherwise.
ClusterSpec cluster_preset(const std::string& name);

/// A preset name or a path to a cluster file.
ClusterSpec read_cluster(const std::string& preset_or_path);

/// Cluster from parsed JSON; problems go to `problems`. `pointer` is the JSON pointer of
/// `json` within `file` ("" for a cluster file; "/cluster" for a job's inline cluster).
ClusterSpec cluster_from_json(const Json& json, const std::string& file, ProblemList& problems,
                              const std::string& pointer = "");

/// Cluster as JSON in the cluster file format, every figure written out.
OrderedJson cluster_to_json(const ClusterSpec& cluster);

}  // namespace dhelix
