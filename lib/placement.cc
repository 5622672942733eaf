#include "lib/placement.h"

#include <algorithm>
#include <set>

#include "lib/error.h"

// A rank is a mixed-radix number whose digits are its tp, cp, dp and pp coordinates, the
// fastest digit first in ParallelSpec::rank_order (ep is skipped: it adds no ranks). A group
// of one dimension is the set of ranks that differ only in that digit. EP groups are cut from
// the cp·dp block instead: the block's members, listed by ascending rank, are split into runs
// of ep (see placement.h).

namespace dhelix {
namespace {

int64_t dim_size(const ParallelSpec& parallel, ParallelDim dim) {
  switch (dim) {
    case ParallelDim::kTp:
      return parallel.tp;
    case ParallelDim::kCp:
      return parallel.cp;
    case ParallelDim::kEp:
      return parallel.ep;
    case ParallelDim::kDp:
      return parallel.dp;
    case ParallelDim::kPp:
      return parallel.pp;
  }
  return 1;
}

int64_t& coordinate_of(RankCoordinates& coordinates, ParallelDim dim) {
  switch (dim) {
    case ParallelDim::kTp:
      return coordinates.tp;
    case ParallelDim::kCp:
      return coordinates.cp;
    case ParallelDim::kEp:
      return coordinates.ep;
    case ParallelDim::kDp:
      return coordinates.dp;
    case ParallelDim::kPp:
      return coordinates.pp;
  }
  return coordinates.tp;
}

// Whether cp varies faster than dp in the rank order: then the cp·dp block lists its
// members cp-fastest.
bool cp_before_dp(const ParallelSpec& parallel) {
  const auto& order = parallel.rank_order;
  return std::find(order.begin(), order.end(), ParallelDim::kCp) <
         std::find(order.begin(), order.end(), ParallelDim::kDp);
}

// Index of a rank within its cp·dp block, in ascending rank order.
int64_t block_index(const ParallelSpec& parallel, const RankCoordinates& c) {
  return cp_before_dp(parallel) ? c.cp + parallel.cp * c.dp : c.dp + parallel.dp * c.cp;
}

// Inverse of block_index: sets cp and dp of `c` from a block index.
void set_block_index(const ParallelSpec& parallel, int64_t index, RankCoordinates& c) {
  if (cp_before_dp(parallel)) {
    c.cp = index % parallel.cp;
    c.dp = index / parallel.cp;
  } else {
    c.dp = index % parallel.dp;
    c.cp = index / parallel.dp;
  }
}

}  // namespace

const char* group_scope_name(GroupScope scope) {
  switch (scope) {
    case GroupScope::kLocal:
      return "local";
    case GroupScope::kCrossNode:
      return "cross-node";
  }
  return "?";
}

Placement::Placement(const ParallelSpec& parallel, int64_t gpus_per_node)
    : parallel_(parallel), gpus_per_node_(gpus_per_node), world_size_(parallel.world_size()) {
  DHELIX_CHECK(gpus_per_node >= 1);
  DHELIX_CHECK(parallel.tp >= 1 && parallel.cp >= 1 && parallel.dp >= 1 && parallel.pp >= 1);
  DHELIX_CHECK(parallel.ep >= 1 && (parallel.cp * parallel.dp) % parallel.ep == 0);
  for (ParallelDim dim : {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kDp, ParallelDim::kPp}) {
    DHELIX_CHECK_MSG(std::count(parallel.rank_order.begin(), parallel.rank_order.end(), dim) == 1,
                     "rank order must name tp, cp, dp and pp once each");
  }
}

RankCoordinates Placement::coordinates(int64_t rank) const {
  DHELIX_CHECK(rank >= 0 && rank < world_size_);
  RankCoordinates c;
  int64_t rest = rank;
  for (ParallelDim dim : parallel_.rank_order) {
    if (dim == ParallelDim::kEp) continue;
    const int64_t size = dim_size(parallel_, dim);
    coordinate_of(c, dim) = rest % size;
    rest /= size;
  }
  c.ep = block_index(parallel_, c) % parallel_.ep;
  return c;
}

int64_t Placement::rank_of(const RankCoordinates& coordinates) const {
  RankCoordinates c = coordinates;
  int64_t rank = 0;
  int64_t stride = 1;
  for (ParallelDim dim : parallel_.rank_order) {
    if (dim == ParallelDim::kEp) continue;
    const int64_t size = dim_size(parallel_, dim);
    const int64_t digit = coordinate_of(c, dim);
    DHELIX_CHECK(digit >= 0 && digit < size);
    rank += digit * stride;
    stride *= size;
  }
  return rank;
}

ProcessGroup Placement::group(ParallelDim dim, int64_t rank) const {
  const RankCoordinates own = coordinates(rank);
  ProcessGroup group;
  group.dim = dim;
  if (dim == ParallelDim::kEp) {
    const int64_t first = block_index(parallel_, own) / parallel_.ep * parallel_.ep;
    for (int64_t i = 0; i < parallel_.ep; ++i) {
      RankCoordinates member = own;
      set_block_index(parallel_, first + i, member);
      group.ranks.push_back(rank_of(member));
    }
  } else {
    for (int64_t i = 0; i < dim_size(parallel_, dim); ++i) {
      RankCoordinates member = own;
      coordinate_of(member, dim) = i;
      group.ranks.push_back(rank_of(member));
    }
  }
  set_span(group);
  return group;
}

void Placement::set_span(ProcessGroup& group) const {
  std::sort(group.ranks.begin(), group.ranks.end());
  std::set<int64_t> nodes;
  for (int64_t member : group.ranks) nodes.insert(node_of(member));
  group.nodes_spanned = static_cast<int64_t>(nodes.size());
  group.scope = group.nodes_spanned == 1 ? GroupScope::kLocal : GroupScope::kCrossNode;
}

ProcessGroup Placement::cp_sub_group(int64_t rank, int64_t a2a_size, CpLevel level) const {
  DHELIX_CHECK(a2a_size >= 1 && parallel_.cp % a2a_size == 0);
  const RankCoordinates own = coordinates(rank);
  ProcessGroup group;
  group.dim = ParallelDim::kCp;
  const bool a2a = level == CpLevel::kA2a;
  const int64_t members = a2a ? a2a_size : parallel_.cp / a2a_size;
  for (int64_t i = 0; i < members; ++i) {
    RankCoordinates member = own;
    member.cp = a2a ? own.cp / a2a_size * a2a_size + i : own.cp % a2a_size + i * a2a_size;
    group.ranks.push_back(rank_of(member));
  }
  set_span(group);
  return group;
}

std::vector<ProcessGroup> Placement::all_groups(ParallelDim dim) const {
  std::vector<ProcessGroup> groups;
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    ProcessGroup candidate = group(dim, rank);
    if (candidate.ranks.front() == rank) groups.push_back(std::move(candidate));
  }
  return groups;
}

}  // namespace dhelix
