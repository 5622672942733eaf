#pragma once
// Every communicator one rank needs: for each of its tp, dp and pp groups and for the world,
// one communicator per thread that may use it (CommSlot). MPI allows several threads to call
// collectives at the same time only on different communicators, and the runtime runs the
// compute thread and two communication-stream threads side by side (DHelix's two strands
// overlap one strand's collectives with the other's), so each gets its own.
//
// Creation is collective: every rank of the world splits MPI_COMM_WORLD in the same fixed
// order (dims tp, dp, pp; within each, slots main, local, cross; then the world per slot),
// with the group's lowest world rank as colour and the world rank as key, so group rank i
// is the i-th lowest world rank of the group, as in Placement::group().

#include <array>
#include <cstdint>
#include <memory>

#include "lib/parallel_spec.h"
#include "lib/placement.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_communicator.h"

namespace dhelix::rt {

/// Which thread a communicator belongs to: the main (compute) thread, or one of the two
/// communication-stream threads.
enum class CommSlot { kMain, kLocalComm, kCrossComm };
inline constexpr int kNumCommSlots = 3;
const char* comm_slot_name(CommSlot slot);  ///< "main", "local-comm", "cross-comm"

/// The communicators of one rank for one job shape.
class ProcessGroups {
 public:
  /// Collective over MPI_COMM_WORLD. Throws Error(kInvalidInput) "the plan needs 4 ranks
  /// (dp 1 x tp 2 x pp 2), mpirun started 2" when the world's size differs from the
  /// placement's (on every rank alike, before any collective), and Error(kUnsupported) when
  /// the placement uses cp > 1 (no communicator for it yet). world_rank must be this
  /// process's rank in MPI_COMM_WORLD.
  ProcessGroups(const Placement& placement, int64_t world_rank);

  /// This rank's group of `dim` (tp, dp or pp) for the thread of `slot`; throws
  /// Error(kUnsupported) for another dimension.
  Communicator& group(ParallelDim dim, CommSlot slot);
  /// A duplicate of MPI_COMM_WORLD for the thread of `slot` (point-to-point transfers).
  Communicator& world(CommSlot slot);

  int64_t world_rank() const { return world_rank_; }

 private:
  static constexpr std::array<ParallelDim, 3> kDims = {ParallelDim::kTp, ParallelDim::kDp,
                                                       ParallelDim::kPp};
  int64_t world_rank_;
  // [dim index in kDims][slot]
  std::array<std::array<std::unique_ptr<MpiCommunicator>, kNumCommSlots>, kDims.size()> groups_;
  std::array<std::unique_ptr<MpiCommunicator>, kNumCommSlots> worlds_;
};

}  // namespace dhelix::rt
