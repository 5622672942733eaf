#include "runtime/train/rank_comms.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

CommSlot slot_of(const std::string& stream) {
  if (stream == "compute") return CommSlot::kMain;
  if (stream == "local_comm") return CommSlot::kLocalComm;
  if (stream == "cross_comm") return CommSlot::kCrossComm;
  throw Error(ErrorCode::kInvalidInput, fmt::format("plan: unknown stream '{}'", stream));
}

ParallelDim dim_of(const std::string& name) {
  for (ParallelDim dim :
       {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp, ParallelDim::kDp, ParallelDim::kPp}) {
    if (name == parallel_dim_name(dim)) return dim;
  }
  throw Error(ErrorCode::kInvalidInput, fmt::format("plan: unknown process group '{}'", name));
}

}  // namespace

Communicator& RankComms::group(const std::string& dim, const std::string& stream) {
  return groups_.group(dim_of(dim), slot_of(stream));
}

Communicator& RankComms::point_to_point(const std::string& stream) {
  return groups_.world(slot_of(stream));
}

}  // namespace dhelix::rt
