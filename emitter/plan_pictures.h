#pragma once
// The pictures dhelix-plan --svg writes (docs/pictures.md says how to read them).

#include <string>
#include <vector>

#include "lib/atomic_file.h"
#include "lib/plan.h"

namespace dhelix {

/// Writes <path_prefix>-pipeline.svg (pipeline_svg) and <path_prefix>-pairing.svg (pairing_svg
/// of pairing 0), each atomically. Throws Error(kIo) naming the path that cannot be written,
/// or what the pictures throw.
void write_svg_files(const Plan& plan, const std::string& path_prefix);

/// Adds both pictures to `files` (written with the command's other outputs).
void add_svg_files(const Plan& plan, const std::string& path_prefix, OutputFiles& files);

/// The two files --svg PREFIX writes.
std::vector<std::string> svg_file_names(const std::string& path_prefix);

}  // namespace dhelix
