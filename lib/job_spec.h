#pragma once
// A training job: which model, on which cluster, spread how. Read from a job file
// (schemas/job.schema.json) and/or command-line flags; flags override the file.

#include <map>
#include <string>

#include "lib/cluster_spec.h"
#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

/// Where a job setting came from, so that a validation message can point at it: a job
/// file and a JSON pointer, or "<flags>" and the flag that set it.
struct FieldOrigin {
  std::string file;     ///< job file as the user named it, or "<flags>"
  std::string pointer;  ///< "/parallel/tp", or the flag ("--tp") when file is "<flags>"
};

struct JobSpec {
  std::string name;
  std::string source_file;  ///< the job file, or "<flags>" when built from flags only
  ModelSpec model;
  ClusterSpec cluster;
  ParallelSpec parallel;
  /// Origins of settings that did not come from `source_file` at their usual pointer,
  /// keyed by field name ("parallel.tp"); see origin_of().
  std::map<std::string, FieldOrigin> origins;

  /// Nodes the job occupies: cluster.num_nodes when fixed, else ceil(world / gpus_per_node).
  int64_t num_nodes() const;
  /// Where `field` ("parallel.tp", "parallel.seq_length", ...) was set: its entry in
  /// `origins`, else {source_file, "/parallel/tp"} (dots become slashes).
  FieldOrigin origin_of(const std::string& field) const;
};

}  // namespace dhelix
