#pragma once
// The MPI communicators the cpu profiler backend measures with: a duplicate of the world for
// the barriers that start every sample together, and, for every group size the job's
// communication ops use, one communicator per strand (the two threads of a co-run), so
// that two collectives of one pair never share a communicator (MPI forbids concurrent
// collectives on one communicator).
//
// A group of size g holds world ranks [c * g, c * g + g) for colour c = rank / g; ranks past
// the last whole group belong to none and skip the op. The profile records rank 0's
// times, and rank 0 is always in the first group.
//
// With emulated links (--emulate-link, runtime/comm/emulated_link.h) an op runs on its
// communicator wrapped for the link of the op's group kind (tp, cp, ...), one link per kind
// shared by both strands, as a rank of dhelix-run has.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "lib/parallel_spec.h"
#include "profiler/cpu/cpu_op_runner.h"
#include "runtime/comm/emulated_link.h"
#include "runtime/comm/link_emulation.h"
#include "runtime/comm/mpi_communicator.h"

namespace dhelix::cpu_profile {

/// Threads of a co-run: strand 0 is the calling thread, strand 1 the helper thread.
inline constexpr int kStrands = 2;

class MeasureGroups {
 public:
  /// Collective over MPI_COMM_WORLD: every rank must pass the same sizes (each >= 1).
  MeasureGroups(const std::vector<int64_t>& group_sizes, int64_t world_rank, int64_t world_size,
                const rt::LinkEmulation& emulation = {});

  /// The world duplicate for barriers; used from the calling thread only.
  rt::Communicator& world() { return *world_; }
  /// This rank's communicator for `kind` groups of `group_size` on `strand` (comm null when
  /// the rank is in no such group). DHELIX_CHECKs that the size was given to the constructor.
  CommBinding binding(int64_t group_size, int strand, ParallelDim kind) const;

 private:
  std::unique_ptr<rt::MpiCommunicator> world_;
  std::map<int64_t, std::array<std::unique_ptr<rt::MpiCommunicator>, kStrands>> groups_;
  // Emulated links by kind (null: the real transport) and the wrappers made for them, by
  // (communicator, kind).
  std::array<std::unique_ptr<rt::EmulatedLink>, kParallelDimNames.names.size()> links_;
  std::map<std::pair<const rt::Communicator*, ParallelDim>,
           std::unique_ptr<rt::EmulatedLinkCommunicator>>
      wrapped_;
};

}  // namespace dhelix::cpu_profile
