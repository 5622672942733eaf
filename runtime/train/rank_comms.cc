#include "runtime/train/rank_comms.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

CommSlot slot_of(StreamClass stream) {
  switch (stream) {
    case StreamClass::kCompute:
      return CommSlot::kMain;
    case StreamClass::kLocalComm:
      return CommSlot::kLocalComm;
    case StreamClass::kCrossComm:
      return CommSlot::kCrossComm;
  }
  throw Error(ErrorCode::kInternal, "plan: a stream outside StreamClass");
}

}  // namespace

Communicator& RankComms::group(ParallelDim dim, StreamClass stream) {
  return groups_.group(dim, slot_of(stream));
}

Communicator& RankComms::point_to_point(StreamClass stream) {
  return groups_.world(slot_of(stream));
}

Communicator& RankComms::cp_level(Placement::CpLevel level, StreamClass stream) {
  return groups_.cp_level(level, slot_of(stream));
}

}  // namespace dhelix::rt
