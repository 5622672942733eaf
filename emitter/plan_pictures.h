#pragma once
// The pictures dhelix-plan --svg writes (docs/pictures.md says how to read them).

#include <string>

#include "lib/plan/plan.h"

namespace dhelix {

/// Writes <path_prefix>-pipeline.svg (pipeline_svg) and <path_prefix>-pairing.svg (pairing_svg
/// of pairing 0), each atomically. Throws Error(kIo) naming the path that cannot be written,
/// or what the pictures throw.
void write_svg_files(const Plan& plan, const std::string& path_prefix);

}  // namespace dhelix
