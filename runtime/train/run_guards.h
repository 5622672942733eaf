#pragma once
// What dhelix-run checks before its first step and after each step, so that a run never
// loses work or trains silently wrong (docs/reliability.md):
//
//   before:  --checkpoint-every and --resume need --checkpoint-dir; the checkpoint folder
//            (while missing: its nearest existing parent) takes a file, found now, not
//            after hours of training; --resume asks for more steps than the checkpoint
//            holds; --loss-log is not the plan, the job or the data, not a directory, and
//            an existing file is a loss log (dhelix-run appends to it: appending to a plan
//            broke the plan).
//   each step: a non-finite loss (naming the step and micro-batch) or gradient stops the run
//            before the optimizer applies it, so the model and the last checkpoint stay as
//            they were after the last good step; SIGINT or SIGTERM lets the step finish,
//            writes a checkpoint, says so and exits 128 + the signal number.

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/train/trainer.h"

namespace dhelix::rt {

/// Throws Error naming the flag and the file when the options cannot give a good run (the
/// "before" list above); creates nothing. Run on every rank (each sees its own file system).
void check_run_options(const TrainOptions& options);

/// The first micro-batch whose loss is not finite, or nothing. `losses` are one head-stage
/// rank's per-micro-batch losses (every micro-batch ran there).
std::optional<int64_t> first_non_finite_loss(const std::vector<float>& losses);

/// "gradient of <name> element <i> is inf", or nothing when every gradient is finite.
std::optional<std::string> first_non_finite_gradient(const std::vector<std::string>& names,
                                                     const std::vector<std::vector<float>>& grads);

/// SIGINT and SIGTERM handlers that only record the signal, for the life of the object
/// (the previous handlers come back after it). One at a time.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The signal received (SIGINT or SIGTERM), 0 while none has.
  static int received();

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

/// "SIGINT", "SIGTERM".
const char* signal_name(int signal);

}  // namespace dhelix::rt
