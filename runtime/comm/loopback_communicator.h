#pragma once
// Communicators between threads of one process: a LoopbackWorld of n ranks, each rank a
// thread, so that the plan interpreter (runtime/exec/interpreter.h) and everything above
// it run a multi-rank job in a unit test, without mpirun. Same contracts as the MPI
// communicators (runtime/comm/communicator.h): sums in group-rank order 0, 1, ..., n-1
// (so results are the same bits as MpiCommunicator's), all_gather in rank order,
// point-to-point messages matched by (sender, receiver, tag) in sending order.
//
// Collectives: every member copies its input into the group's staging area, waits for the
// others, computes its own output from the staged inputs, and waits again before the
// staging area is reused, so in-place all-reduces are safe. Sends are buffered (copied at
// once, done when started); a receive waits until its message has been sent.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace dhelix::rt {

class LoopbackWorld {
 public:
  /// A world of `size` >= 1 ranks.
  explicit LoopbackWorld(int64_t size);
  ~LoopbackWorld();
  LoopbackWorld(const LoopbackWorld&) = delete;
  LoopbackWorld& operator=(const LoopbackWorld&) = delete;

  int64_t size() const;

  /// World rank `rank`'s communicator over `members` (world ranks, ascending, holding
  /// rank), named `name`. Members asking with the same `key` share one group; a thread uses
  /// its communicator alone, as with MPI. Point-to-point calls of any of them reach every
  /// rank of the world.
  std::unique_ptr<Communicator> communicator(const std::string& key,
                                             const std::vector<int64_t>& members, int64_t rank,
                                             const std::string& name);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace dhelix::rt
