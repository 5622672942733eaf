#pragma once
// The short text report dhelix-plan prints after planning: the schemes side by side,
// where communication stays exposed, the pairing scope chosen, and memory per stage.
//
//   llama-25b-a40-dp8-tp8: 128 micro-batches, pp 1, 64 GPUs (A40)
//   scheme          iteration    TFLOPS/GPU    MFU   bubble  exposed comm  speed-up
//   dhelix           61.234 s       83.1     55.4 %   0.4 %     1.234 s     1.31x
//   ...

#include <string>

#include "lib/plan.h"

namespace dhelix {

/// The report of `plan` (every line ends in a newline).
std::string plan_report_text(const Plan& plan);

}  // namespace dhelix
