#pragma once
// An error every rank knows about before any of them started training: a bad plan, job,
// data file or rank count (runtime/train/trainer.cc), or pipeline channels whose two ends
// disagree (runtime/cuda/channel_agreement.h). The ranks agree on it with a collective, so
// each can exit normally instead of aborting the job; a rank whose own part was fine
// reports that another rank failed.

#include "lib/error.h"

namespace dhelix::rt {

class SetupFailure : public Error {
 public:
  using Error::Error;
};

}  // namespace dhelix::rt
