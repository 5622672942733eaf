#pragma once
// Placement: which ranks form each process group, and whether a group stays inside one
// node (its traffic uses the intra-node link) or crosses nodes (the network).
//
// Ranks are numbered by the rank order (ParallelSpec::rank_order, fastest first). With
// Megatron's default tp-cp-ep-dp-pp and tp=2, cp=1, dp=2, pp=2 on 4-GPU nodes:
// rank = tp_rank + 2·dp_rank + 4·pp_rank, so TP groups are {0,1} {2,3} {4,5} {6,7} (local)
// and PP groups {0,4} {1,5} {2,6} {3,7} (cross-node). EP does not add ranks: the cp·dp block
// of a rank is split into EP groups of ep consecutive members (expert-data-parallel outside).
// Nodes hold consecutive ranks: node = rank / gpus_per_node.

#include <cstdint>
#include <vector>

#include "lib/parallel_spec.h"

namespace dhelix {

/// Whether a group's traffic stays on the intra-node link.
enum class GroupScope { kLocal, kCrossNode };
const char* group_scope_name(GroupScope scope);  ///< "local", "cross-node"

/// Coordinates of a rank along every dimension.
struct RankCoordinates {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
  int64_t ep = 0;  ///< index within its EP group (MoE only; 0 otherwise)
};

struct ProcessGroup {
  ParallelDim dim = ParallelDim::kTp;
  std::vector<int64_t> ranks;  ///< ascending
  GroupScope scope = GroupScope::kLocal;
  int64_t nodes_spanned = 1;  ///< distinct nodes its ranks live on
};

/// Maps ranks to coordinates and groups for one job shape.
class Placement {
 public:
  Placement(const ParallelSpec& parallel, int64_t gpus_per_node);

  int64_t world_size() const { return world_size_; }
  RankCoordinates coordinates(int64_t rank) const;
  int64_t rank_of(const RankCoordinates& coordinates) const;
  int64_t node_of(int64_t rank) const { return rank / gpus_per_node_; }
  /// The group of `dim` that holds `rank` (a group of size one when the dimension is 1).
  ProcessGroup group(ParallelDim dim, int64_t rank) const;
  /// The CP sub-group of `rank` for a2a+p2p (Megatron-LM's hierarchical context parallelism,
  /// --hierarchical-context-parallel-sizes A P): level kA2a holds the A CP ranks with the same
  /// cp / A (adjacent CP ranks), level kRing the P with the same cp mod A. With cp = 4, A = 2
  /// the CP ranks {0,1} {2,3} do the all-to-all and {0,2} {1,3} the ring.
  enum class CpLevel { kA2a, kRing };
  ProcessGroup cp_sub_group(int64_t rank, int64_t a2a_size, CpLevel level) const;
  /// All distinct groups of one dimension, ordered by their lowest rank.
  std::vector<ProcessGroup> all_groups(ParallelDim dim) const;

 private:
  void set_span(ProcessGroup& group) const;  ///< sorts the ranks, sets scope and nodes_spanned

  ParallelSpec parallel_;
  int64_t gpus_per_node_;
  int64_t world_size_;
};

}  // namespace dhelix
