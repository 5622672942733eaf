#include "runtime/train/rank_agreement.h"

#include <string>

#include <fmt/format.h>

#include "runtime/train/setup_failure.h"

namespace dhelix::rt {

bool any_rank(Communicator& world, bool mine) { return world.all_reduce_max(mine ? 1 : 0) != 0; }

void agree_on_setup(Communicator& world, std::exception_ptr failure) {
  // The first failing rank: the smallest rank that failed, as the largest negated rank.
  const int64_t first = -world.all_reduce_max(failure ? -world.rank() : -world.size());
  if (first == world.size()) return;
  std::string message;
  int64_t code = static_cast<int64_t>(ErrorCode::kInternal);
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const Error& error) {
      message = error.what();
      code = static_cast<int64_t>(error.code());
    }
  }
  // Every rank exits with the first failing rank's status.
  code = world.all_reduce_max(world.rank() == first ? code : -1);
  if (world.rank() == first) throw SetupFailure(static_cast<ErrorCode>(code), message);
  throw SetupFailure(static_cast<ErrorCode>(code), fmt::format("stopped: rank {} failed", first),
                     true);
}

}  // namespace dhelix::rt
