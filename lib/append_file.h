#pragma once
// A log a tool appends to line by line (dhelix-run --loss-log), opened by the rules every
// output follows (lib/output_target.h): a symbolic link is followed and kept (a dangling
// one creates its target), a read-only file, a directory, a block device or a socket is
// refused, and a FIFO that no process reads is refused after 2 s instead of blocking the
// tool forever (std::ofstream waited in open(2)).

#include <string>

namespace dhelix {

class AppendFile {
 public:
  AppendFile() = default;
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  /// Opens `path` for appending, creating a regular file that is not there yet. Throws
  /// Error(kIo) "<path>: cannot write file: <why>".
  void open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  /// Appends `text` whole. Throws Error(kIo) naming the file.
  void append(const std::string& text);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace dhelix
