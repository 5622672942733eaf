#include "lib/append_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "lib/output_target.h"

namespace dhelix {

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::open(const std::string& path) {
  const OutputTarget target = resolve_output_target(path);
  int fd = -1;
  if (target.write_through) {
    fd = open_write_through(target.path);
  } else {
    // The resolved path, not `path`: a dangling link's target is created where it points.
    fd = ::open(target.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) throw_write_error(path, "opening for appending", errno);
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  path_ = path;
}

void AppendFile::append(const std::string& text) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_write_error(path_, "appending", errno);
    }
    written += static_cast<size_t>(n);
  }
}

}  // namespace dhelix
