#pragma once
// Every communicator one rank needs: for each of its tp, cp, dp, pp and ep groups and for the
// world, one communicator per thread that may use it (CommSlot). MPI allows several threads to call
// collectives at the same time only on different communicators, and the runtime runs the
// compute thread and two communication-stream threads side by side (DHelix's two strands
// overlap one strand's collectives with the other's), so each gets its own.
//
// Creation is collective: every rank of the world splits MPI_COMM_WORLD in the same fixed
// order (dims tp, cp, dp, pp, ep; within each, slots main, local, cross; then the world per
// slot; then, with cp > 1, the DP x CP group; then the expert-data-parallel group; then the
// gradient-reduction thread's TP, DP x CP and expert-data-parallel groups; then, for
// cp_comm_type a2a+p2p, the CP sub-groups, a2a then ring, per slot), with the
// group's lowest world rank as colour and the world rank as key, so group rank i is the i-th
// lowest world rank of the group, as in Placement::group(): a CP group's rank i is CP
// coordinate i, the ring order of runtime/kernels/context_parallel.h.
//
// Dense gradients are summed over DP x CP: the ranks of one TP coordinate and one pipeline
// stage hold the same weights, each CP rank having seen its share of every sequence
// (gradient_group).
//
// Expert parallelism (MoE), as Megatron-Core: EP adds no ranks, its groups are runs of ep
// consecutive members of the cp·dp block (lib/placement.h). Gradients are summed so that
// every weight sees every token of the global batch exactly once:
//   dense weights (attention, norms, router, embedding, head): over the dp group (the whole
//     cp·dp block, EP members included), as without EP;
//   expert weights: over the expert-data-parallel group only, the ranks with the same tp,
//     pp and EP index (dp·cp / ep of them): the EP members hold different experts, and the
//     dispatch all-to-all already brought every EP member's tokens to the expert.
// Both are sums of gradients of the one global loss (the trainer scales by 1 / tokens of
// the global batch), the semantics of Megatron-Core's DDP where dense and expert gradients
// are both scaled by 1 / (dp·cp) and reduced over dp·cp and the expert-dp group.
//
// Emulated links (dhelix-run --emulate-link, runtime/comm/emulated_link.h): every accessor
// then returns the MPI communicator wrapped so that its transfers complete on the rank's
// link of its kind: a dim's groups on that dim's link; the DP x CP, expert-data-parallel
// and gradient-reduction groups on the dp link (the gradient sums cross the data-parallel
// network), the reduction thread's TP copy on the tp link; the worlds' point-to-point
// transfers (pipeline sends and receives) on the pp link.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/parallel_spec.h"
#include "lib/placement.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/emulated_link.h"
#include "runtime/comm/link_emulation.h"
#include "runtime/comm/mpi_communicator.h"

namespace dhelix::rt {

/// Which thread a communicator belongs to: the main (compute) thread, or one of the two
/// communication-stream threads.
enum class CommSlot { kMain, kLocalComm, kCrossComm };
inline constexpr int kNumCommSlots = 3;
const char* comm_slot_name(CommSlot slot);  ///< "main", "local-comm", "cross-comm"

/// The world ranks dense gradients are summed over with `rank`'s: those of its TP
/// coordinate and stage (every DP and CP coordinate), ascending.
std::vector<int64_t> dp_cp_members(const Placement& placement, int64_t rank);

/// The communicators of one rank for one job shape.
class ProcessGroups {
 public:
  /// Collective over MPI_COMM_WORLD. Throws Error(kInvalidInput) "the plan needs 4 ranks
  /// (dp 1 x tp 2 x pp 2), mpirun started 2" when the world's size differs from the
  /// placement's (on every rank alike, before any collective). world_rank must be this
  /// process's rank in MPI_COMM_WORLD.
  /// With `emulation` enabled, throws Error(kUnsupported) on every rank unless all ranks
  /// run on one host (the emulated link compares clock readings across ranks).
  /// `cp_a2a_size` > 1 (cp_comm_type a2a+p2p, --hierarchical-context-parallel-sizes A P):
  /// also the CP sub-groups of Placement::cp_sub_group, split after every group above.
  ProcessGroups(const Placement& placement, int64_t world_rank, const LinkEmulation& emulation = {},
                int64_t cp_a2a_size = 0);

  /// This rank's group of `dim` (tp, cp, dp, pp or ep) for the thread of `slot`; throws
  /// Error(kUnsupported) for another dimension.
  Communicator& group(ParallelDim dim, CommSlot slot);
  /// a2a+p2p: this rank's CP sub-group of `level` for the thread of `slot`; the whole CP
  /// group when the job has no sub-groups (its all-to-alls and ring span all of cp).
  Communicator& cp_level(Placement::CpLevel level, CommSlot slot);
  /// The expert-data-parallel group (see the file comment), for the main thread: where
  /// expert weights' gradients are summed; the dp group's members when ep = 1.
  Communicator& expert_data_parallel() { return emulated(expert_dp_); }
  /// The world ranks of `world_rank`'s expert-data-parallel group, ascending.
  static std::vector<int64_t> expert_data_parallel_ranks(const Placement& placement,
                                                         int64_t world_rank);
  /// A duplicate of MPI_COMM_WORLD for the thread of `slot` (point-to-point transfers).
  Communicator& world(CommSlot slot);
  /// The main thread's group that dense gradients are summed over: DP x CP, the ranks
  /// with this rank's TP coordinate and stage, ascending (the DP group when cp = 1).
  Communicator& gradient_group();

  /// The gradient-reduction thread's own copies (runtime/train/gradient_reduction.h) of
  /// the TP group, gradient_group() and expert_data_parallel(): the same members, used by
  /// no other thread.
  Communicator& reduction_tp() { return emulated(reduction_tp_); }
  Communicator& reduction_gradient_group() { return emulated(reduction_dp_cp_); }
  Communicator& reduction_expert_data_parallel() { return emulated(reduction_expert_dp_); }
  /// The links in use, "" when none is emulated (LinkEmulation::describe()).
  const std::string& link_emulation() const { return emulation_text_; }
  /// How late this rank's calls returned on each emulated link (EmulatedLink::lateness),
  /// in kParallelDimNames order; empty when none is emulated.
  std::vector<std::pair<ParallelDim, LinkLateness>> link_lateness() const;

  int64_t world_rank() const { return world_rank_; }

 private:
  static constexpr std::array<ParallelDim, 5> kDims = {
      ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kDp, ParallelDim::kPp, ParallelDim::kEp};
  int64_t world_rank_;
  // [dim index in kDims][slot]
  std::array<std::array<std::unique_ptr<MpiCommunicator>, kNumCommSlots>, kDims.size()> groups_;
  std::array<std::unique_ptr<MpiCommunicator>, kNumCommSlots> worlds_;
  // [level][slot], a2a+p2p only
  std::array<std::array<std::unique_ptr<MpiCommunicator>, kNumCommSlots>, 2> cp_levels_;
  std::unique_ptr<MpiCommunicator> dp_cp_;  // cp > 1 only
  std::unique_ptr<MpiCommunicator> expert_dp_;
  std::unique_ptr<MpiCommunicator> reduction_tp_;
  std::unique_ptr<MpiCommunicator> reduction_dp_cp_;
  std::unique_ptr<MpiCommunicator> reduction_expert_dp_;

  // Emulated links: one per kind (null: not emulated), and the wrapper of each
  // communicator above that has one.
  void wrap_for_emulation(const LinkEmulation& emulation);
  void wrap(const std::unique_ptr<MpiCommunicator>& comm, EmulatedLink* collectives,
            EmulatedLink* transfers);
  Communicator& emulated(const std::unique_ptr<MpiCommunicator>& comm);
  std::array<std::unique_ptr<EmulatedLink>, kParallelDimNames.names.size()> links_;
  std::map<const Communicator*, std::unique_ptr<EmulatedLinkCommunicator>> wrapped_;
  std::string emulation_text_;
};

}  // namespace dhelix::rt
