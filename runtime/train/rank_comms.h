#pragma once
// The interpreter's view of a rank's MPI process groups: streams map to the communicator
// slots of runtime/comm/process_groups.h.

#include <string>

#include "runtime/comm/process_groups.h"
#include "runtime/exec/interpreter.h"

namespace dhelix::rt {

class RankComms final : public CommunicatorDirectory {
 public:
  explicit RankComms(ProcessGroups& groups) : groups_(groups) {}
  Communicator& group(ParallelDim dim, StreamClass stream) override;
  Communicator& point_to_point(StreamClass stream) override;
  Communicator& cp_level(Placement::CpLevel level, StreamClass stream) override;
  /// The group of `dim` for the calling (main) thread.
  Communicator& main_group(ParallelDim dim) { return groups_.group(dim, CommSlot::kMain); }
  /// The group dense gradients are summed over (DP x CP), for the calling (main) thread.
  Communicator& gradient_group() { return groups_.gradient_group(); }
  /// The expert-data-parallel group (MoE experts' gradients), for the main thread.
  Communicator& main_expert_data_parallel() { return groups_.expert_data_parallel(); }
  /// Every rank, for the calling (main) thread.
  Communicator& main_world() { return groups_.world(CommSlot::kMain); }

 private:
  ProcessGroups& groups_;
};

}  // namespace dhelix::rt
