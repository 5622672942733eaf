#include "runtime/train/rank_agreement.h"

#include "runtime/train/setup_failure.h"

namespace dhelix::rt {

bool any_rank(Communicator& world, bool mine) { return world.all_reduce_max(mine ? 1 : 0) != 0; }

void agree_on_setup(Communicator& world, std::exception_ptr failure) {
  if (!any_rank(world, failure != nullptr)) return;
  if (!failure) {
    throw SetupFailure(ErrorCode::kInvalidInput, "stopped: another rank failed to start");
  }
  try {
    std::rethrow_exception(failure);
  } catch (const Error& error) {
    throw SetupFailure(error.code(), error.what());
  }
}

}  // namespace dhelix::rt
