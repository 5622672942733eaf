#pragma once
// Reading an input file (a job, model, cluster, profile, plan, trace, training data) whole.
//
// Only a regular file is read (symbolic links followed). Anything else is refused before it
// is opened, with Error(kIo) naming the file and what it is:
//
//   | input                          | what happens                                         |
//   |--------------------------------|------------------------------------------------------|
//   | regular file (or a link to one)| read                                                 |
//   | directory                      | "is a directory, expected a file"                    |
//   | FIFO (named pipe, <(...))      | refused at once: opening one nobody writes waits     |
//   |                                | forever, and dhelix reads an input more than once    |
//   |                                | (its checksum goes into the provenance of outputs)   |
//   | character device (/dev/zero)   | refused: a device has no end and no size             |
//   | block device, socket           | refused                                              |
//
// The file is opened with O_NONBLOCK and checked again through the descriptor, so that a
// FIFO put in its place between the check and the open cannot make the reader wait.

#include <cstdint>
#include <functional>
#include <string>

namespace dhelix {

/// Throws Error(kIo) "<path>: is a FIFO (named pipe), not a regular file; ..." unless `path`
/// is a regular file; nothing is opened. Errors of stat(2) (a missing file) are not thrown
/// here: the read that follows names them.
void require_regular_input(const std::string& path);

/// Reads the regular file `path` whole. `check_size`, when given, sees the file's size
/// before anything is read and may throw (a file too large to load). Throws Error(kIo)
/// naming the path: not a regular file (see the table), cannot be opened, read error.
std::string read_input_file(const std::string& path,
                            const std::function<void(uint64_t size)>& check_size = {});

}  // namespace dhelix
