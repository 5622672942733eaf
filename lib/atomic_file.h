#pragma once
// Writing output files so that a crash never leaves half a file: the content goes to
// a temporary file beside the target, is flushed to disk, and is renamed over the
// target in one step (rename(2) is atomic within a file system).

#include <string>

namespace dhelix {

/// Writes `content` to `path` atomically. Throws Error(kIo) naming the path and the
/// reason; on failure the previous file at `path`, if any, is left untouched and the
/// temporary file is removed.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace dhelix
