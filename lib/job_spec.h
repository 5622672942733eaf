#pragma once
// A training job: which model, on which cluster, spread how. Read from a job file
// (schemas/job.schema.json) and/or command-line flags; flags override the file.

#include <string>

#include "lib/cluster_spec.h"
#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

struct JobSpec {
  std::string name;
  std::string source_file;  ///< the job file, or "<flags>" when built from flags only
  ModelSpec model;
  ClusterSpec cluster;
  ParallelSpec parallel;

  /// Nodes the job occupies: cluster.num_nodes when fixed, else ceil(world / gpus_per_node).
  int64_t num_nodes() const;
};

}  // namespace dhelix
