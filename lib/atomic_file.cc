#include "lib/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int error_number) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot write file: {}: {}", path, what,
                                          std::strerror(error_number)));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& content) {
  // The temporary file lives in the same directory so that rename() stays atomic.
  std::string temporary = path + ".tmp.XXXXXX";
  const int fd = mkstemp(temporary.data());
  if (fd < 0) fail(path, "creating a temporary file", errno);
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      fail(path, "writing", saved);
    }
    written += static_cast<size_t>(n);
  }
  // mkstemp creates the file 0600; output files get the mode open(O_CREAT, 0666) would
  // give them, which honours the user's umask. POSIX can only read the umask by setting
  // it, so it is set back at once (the tools write files from one thread).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  // close() even when fsync() fails, so the descriptor never leaks.
  const int sync_error = ::fsync(fd) != 0 ? errno : 0;
  const int close_error = ::close(fd) != 0 ? errno : 0;
  if (sync_error != 0 || close_error != 0) {
    ::unlink(temporary.c_str());
    fail(path, "flushing to disk", sync_error != 0 ? sync_error : close_error);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.c_str());
    fail(path, "renaming the temporary file into place", saved);
  }
}

}  // namespace dhelix
