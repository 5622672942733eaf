#pragma once
// Writing output files so that nothing on disk is lost or half-written.
//
// Where the content goes is lib/output_target.h's decision, the same for every output:
// a regular file (or a path that does not exist yet) is written atomically: the content goes
// to a temporary file beside the target ("<target>.tmp.XXXXXX"), is flushed to disk, and is
// renamed over the target in one step (rename(2) is atomic within a file system). A file
// replaced keeps its permission bits (and, for root, its owner). A symbolic link keeps the
// link: the file it points at is replaced, or, for a dangling link, created, the same way.
// A file without write permission (chmod 0444) is refused, not replaced.
//
// A special file is never replaced, since renaming over /dev/null would turn the device
// node into a regular file (and, as root, take the null device away from every program).
// Instead the content is written through it, in place:
//
//   | target                                   | what happens                                |
//   |------------------------------------------|---------------------------------------------|
//   | regular file, new path, link to a file,  | temporary file, fsync, rename               |
//   | dangling link                            |                                             |
//   | regular file without write permission    | refused ("is read-only")                    |
//   | character device (/dev/null, /dev/full)  | written through; ENOSPC from /dev/full is   |
//   |                                          | an error                                    |
//   | FIFO with a reader                       | written through                             |
//   | FIFO without a reader                    | refused after 2 s (open would wait forever) |
//   | /dev/stdout, /dev/fd/N, /proc/...        | written through, appended (a regular file   |
//   |                                          | behind stdout keeps what is already there)  |
//   | directory, block device, socket          | refused                                     |
//
// A command with several outputs (a plan, its trace and two pictures) writes them with
// OutputFiles, so that they succeed or fail together: every temporary file is written and
// flushed, and every special file written through, before the first rename. A full disk
// therefore leaves every old target as it was. Only a failing rename(2) itself, after
// earlier renames of the same command succeeded, can leave a mix; rename fails only for
// reasons (a target directory removed meanwhile) that no write of the content can cause.

#include <string>
#include <utility>
#include <vector>

namespace dhelix {

/// Writes `content` to `path` as the table above says. Throws Error(kIo) naming the path and
/// the reason; on failure the previous file at `path`, if any, is left untouched and the
/// temporary file is removed.
void write_file_atomically(const std::string& path, const std::string& content);

/// Throws Error(kIo) when `path` cannot be an output file (a directory, a block device, a
/// socket, a read-only file, a path whose folder does not exist; a FIFO is not opened
/// here, so one nobody reads is found when it is written): the check a tool makes
/// before its work, so that a bad output path is found before minutes of planning.
void check_output_path(const std::string& path);

/// The outputs of one command, written together (see the file comment).
class OutputFiles {
 public:
  /// Adds one output; nothing is written yet.
  void add(std::string path, std::string content);
  /// Writes every output. Throws Error(kIo) naming the file that failed; when a write or
  /// flush fails, no target has been replaced and every temporary file is removed.
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace dhelix
