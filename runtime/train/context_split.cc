#include "runtime/train/context_split.h"

#include "lib/error.h"
#include "runtime/kernels/context_parallel.h"

namespace dhelix::rt {

MicroBatchTokens context_parallel_share(const MicroBatchTokens& full, int64_t batch,
                                        int64_t seq_length, int64_t cp, int64_t cp_rank) {
  DHELIX_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp && seq_length % (2 * cp) == 0);
  DHELIX_CHECK(static_cast<int64_t>(full.tokens.size()) == batch * seq_length &&
               full.targets.size() == full.tokens.size());
  const int64_t local = seq_length / cp, chunk = local / 2;
  MicroBatchTokens share;
  share.tokens.reserve(static_cast<size_t>(batch * local));
  share.targets.reserve(static_cast<size_t>(batch * local));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < local; ++i) {
      const auto at =
          static_cast<size_t>(b * seq_length + kernels::cp_global_position(cp, cp_rank, chunk, i));
      share.tokens.push_back(full.tokens[at]);
      share.targets.push_back(full.targets[at]);
    }
  }
  return share;
}

}  // namespace dhelix::rt
