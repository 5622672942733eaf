#include "lib/job_spec.h"

#include <algorithm>

namespace dhelix {

int64_t JobSpec::num_nodes() const {
  if (cluster.num_nodes > 0) return cluster.num_nodes;
  if (cluster.gpus_per_node <= 0) return 0;
  return (parallel.world_size() + cluster.gpus_per_node - 1) / cluster.gpus_per_node;
}

FieldOrigin JobSpec::origin_of(const std::string& field) const {
  auto it = origins.find(field);
  if (it != origins.end()) return it->second;
  std::string pointer = "/" + field;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return {source_file, pointer};
}

}  // namespace dhelix
