#pragma once
// Where an output file's content goes, and whether it may go there at all: the one check
// every output of every tool passes (lib/atomic_file.h writes files whole, lib/append_file.h
// appends to logs).
//
//   | output path                              | target                                    |
//   |------------------------------------------|-------------------------------------------|
//   | new path, regular file                   | the path                                  |
//   | symbolic link to a file                  | the file it points at; the link is kept   |
//   | dangling symbolic link (chains too)      | the path the last link names, created     |
//   |                                          | there; the link is kept (as the shell's   |
//   |                                          | `>` does; GNU cp refuses instead); its    |
//   |                                          | folder must exist                         |
//   | regular file without write permission    | refused: "is read-only; dhelix does not   |
//   |                                          | overwrite a file without write permission"|
//   | character device, FIFO, /dev/stdout      | written through in place, never replaced  |
//   | directory, block device, socket          | refused                                   |
//
// Write permission is read from the permission bits for root (access(2) says yes to root
// for every file): a file nobody may write (chmod 0444) is write-protected for root too.
// Other users get access(2)'s answer for their effective ids.

#include <sys/types.h>

#include <string>

namespace dhelix {

/// Throw Error(kIo) "<path>: cannot write file: <what>: <strerror(error_number)>", and
/// "<path>: cannot write file: <why>": the two shapes of every output error.
[[noreturn]] void throw_write_error(const std::string& path, const std::string& what,
                                    int error_number);
[[noreturn]] void throw_write_refusal(const std::string& path, const std::string& why);

/// Where one output goes (the table above).
struct OutputTarget {
  std::string path;            ///< the file written: the user's path with links followed
  bool write_through = false;  ///< a special file, written in place (never renamed over)
  bool exists = false;         ///< a regular file is there now: its mode and owner are kept
  mode_t mode = 0;             ///< when it exists: its permission bits
  uid_t owner = 0;             ///< when it exists: its owner and group
  gid_t group = 0;
};

/// The target of the output `path`. Throws Error(kIo) "<path>: cannot write file: <why>"
/// for the refusals of the table (an empty path too).
OutputTarget resolve_output_target(const std::string& path);

/// The path a chain of symbolic links starting at `path` ends at, whether or not a file is
/// there (`path` itself when it is no link; unchanged on a loop). Never throws: for
/// comparing names (tools/output_paths.h), not for writing.
std::string follow_links(const std::string& path);

/// Opens the special file `path` for writing, appending, without waiting forever: a FIFO
/// that no process reads is given 2 s for a reader to open it, then refused. Returns the
/// descriptor (blocking again). Throws Error(kIo) naming `path`.
int open_write_through(const std::string& path);

}  // namespace dhelix
