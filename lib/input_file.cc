#include "lib/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

// Why a file that is not a regular one is not read, by its type (the table in the header).
void refuse_special(const std::string& path, mode_t mode) {
  if (S_ISREG(mode)) return;
  if (S_ISDIR(mode)) {
    throw Error(ErrorCode::kIo, fmt::format("{}: is a directory, expected a file", path));
  }
  const char* what = S_ISFIFO(mode)   ? "a FIFO (named pipe)"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "not a file";
  throw Error(ErrorCode::kIo,
              fmt::format("{}: is {}, not a regular file; dhelix reads an input whole and more "
                          "than once (its checksum goes into the outputs): save the content "
                          "into a file and name that",
                          path, what));
}

// Closes the descriptor however the read ends.
struct Descriptor {
  int fd;
  ~Descriptor() { ::close(fd); }
};

}  // namespace

void require_regular_input(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) refuse_special(path, info.st_mode);
}

std::string read_input_file(const std::string& path,
                            const std::function<void(uint64_t size)>& check_size) {
  require_regular_input(path);
  // O_NONBLOCK: should a FIFO have taken the file's place since the check, open returns
  // at once instead of waiting for a writer; fstat below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, fmt::format("{}: cannot open file for reading", path));
  const Descriptor descriptor{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw Error(ErrorCode::kIo, fmt::format("{}: read error: {}", path, std::strerror(errno)));
  }
  refuse_special(path, info.st_mode);
  if (check_size) check_size(static_cast<uint64_t>(info.st_size));
  std::string text;
  text.reserve(static_cast<size_t>(info.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo, fmt::format("{}: read error: {}", path, std::strerror(errno)));
    }
    text.append(chunk, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace dhelix
