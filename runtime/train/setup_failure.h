#pragma once
// An error every rank knows about: a bad plan, job, data file or rank count, a checkpoint
// that cannot be read or written (runtime/train/trainer.cc), or pipeline channels whose two
// ends disagree (runtime/cuda/channel_agreement.h). The ranks agree on it with a collective,
// so each can exit normally instead of aborting the job. The message is printed once: by
// the first rank that failed; the others carry `reported_elsewhere` and stay silent.

#include <string>
#include <utility>

#include "lib/error.h"

namespace dhelix::rt {

class SetupFailure : public Error {
 public:
  using Error::Error;
  /// Another rank prints this failure; this one exits with its status, silently.
  SetupFailure(ErrorCode code, std::string message, bool reported_elsewhere)
      : Error(code, std::move(message)), reported_elsewhere_(reported_elsewhere) {}
  bool reported_elsewhere() const { return reported_elsewhere_; }

 private:
  bool reported_elsewhere_ = false;
};

}  // namespace dhelix::rt
