#pragma once
// The interpreter's communicators for tests without mpirun: each rank a thread of one
// LoopbackWorld (runtime/comm/loopback_communicator.h), a group per (dimension, stream) as
// the placement says, the world per stream. `run` prefixes every group key, so that two
// executions in one world never share a group.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/placement.h"
#include "runtime/comm/loopback_communicator.h"
#include "runtime/exec/interpreter.h"

namespace dhelix::rt {

// One rank's communicators: a group per (dimension, stream), the world per stream.
class LoopbackDirectory final : public CommunicatorDirectory {
 public:
  LoopbackDirectory(LoopbackWorld& world, const Placement& placement, int64_t rank,
                    const std::string& run)
      : world_(world), placement_(placement), rank_(rank), run_(run) {}

  Communicator& group(ParallelDim parsed, StreamClass stream_class) override {
    auto& slot = groups_[{parsed, stream_class}];
    if (!slot) {
      // The loopback world matches members by a key string: the group's identity.
      const std::string dim = parallel_dim_name(parsed);
      const std::string stream = stream_class_name(stream_class);
      const ProcessGroup g = placement_.group(parsed, rank_);
      slot = world_.communicator(run_ + dim + "/" + stream + "/" + std::to_string(g.ranks[0]),
                                 g.ranks, rank_, dim);
    }
    return *slot;
  }

  Communicator& point_to_point(StreamClass stream_class) override {
    auto& slot = worlds_[stream_class];
    if (!slot) {
      std::vector<int64_t> all;
      for (int64_t r = 0; r < world_.size(); ++r) all.push_back(r);
      slot = world_.communicator(run_ + "world/" + stream_class_name(stream_class), all, rank_,
                                 "world");
    }
    return *slot;
  }

 private:
  LoopbackWorld& world_;
  const Placement& placement_;
  int64_t rank_;
  std::string run_;
  std::map<std::pair<ParallelDim, StreamClass>, std::unique_ptr<Communicator>> groups_;
  std::map<StreamClass, std::unique_ptr<Communicator>> worlds_;
};

}  // namespace dhelix::rt
