#include "lib/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int error_number) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot write file: {}: {}", path, what,
                                          std::strerror(error_number)));
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot write file: {}", path, why));
}

// How one output reaches its target (the table in the header).
struct Target {
  std::string path;  // where the temporary file goes and what is renamed over (links resolved)
  bool write_through = false;
};

// How long an output FIFO may wait for its reader to open it.
constexpr int kFifoGraceMs = 2000;
constexpr int kFifoPollMs = 10;

bool under_system_folder(const std::string& path) {
  return path.starts_with("/dev/") || path.starts_with("/proc/");
}

Target classify(const std::string& path) {
  if (path.empty()) refuse(path, "the file name is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) fail(path, "looking at the target", errno);
    return {.path = path, .write_through = false};
  }
  if (S_ISDIR(info.st_mode)) refuse(path, "is a directory, expected a file");
  if (S_ISBLK(info.st_mode)) refuse(path, "is a block device; dhelix never writes one");
  if (S_ISSOCK(info.st_mode)) refuse(path, "is a socket, expected a file");
  if (S_ISCHR(info.st_mode) || S_ISFIFO(info.st_mode)) return {.path = path, .write_through = true};
  // A regular file behind /dev/stdout or /proc/self/fd/N belongs to whoever opened it.
  if (under_system_folder(path)) return {.path = path, .write_through = true};
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code error;
    const std::filesystem::path resolved = std::filesystem::canonical(path, error);
    if (error) fail(path, "resolving the symbolic link", error.value());
    return {.path = resolved.string(), .write_through = false};
  }
  return {.path = path, .write_through = false};
}

void write_all(int fd, const std::string& path, const std::string& content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "writing", errno);
    }
    written += static_cast<size_t>(n);
  }
}

bool same_file(const struct stat& a, int fd) {
  struct stat b {};
  return ::fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Writes `content` through a special file, in place. When the target is this process's own
// standard output or error (/dev/stdout, or the terminal or pipe it is), the content goes to
// that descriptor after what the process has already printed there.
void write_through(const std::string& path, const std::string& content) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    for (auto [stream, fd] : {std::pair{stdout, STDOUT_FILENO}, std::pair{stderr, STDERR_FILENO}}) {
      if (!same_file(info, fd)) continue;
      std::fflush(stream);
      write_all(fd, path, content);
      return;
    }
  }
  // O_NONBLOCK: opening a FIFO nobody reads fails (ENXIO) instead of waiting forever. A
  // reader started just before the tool gets a grace period to open its end.
  int fd = -1;
  for (int waited_ms = 0;; waited_ms += kFifoPollMs) {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 || errno != ENXIO || waited_ms >= kFifoGraceMs) break;
    ::usleep(kFifoPollMs * 1000);
  }
  if (fd < 0) {
    if (errno == ENXIO) {
      refuse(path, fmt::format("is a FIFO that no process is reading (waited {} s)",
                               kFifoGraceMs / 1000));
    }
    fail(path, "opening", errno);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  try {
    write_all(fd, path, content);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail(path, "closing", errno);
}

// Writes `content` to a new temporary file beside `target` and flushes it to disk; returns
// its name. On failure nothing is left behind.
std::string write_temporary(const std::string& target, const std::string& content) {
  // The temporary file lives in the same directory so that rename() stays atomic.
  std::string temporary = target + ".tmp.XXXXXX";
  const int fd = mkstemp(temporary.data());
  if (fd < 0) fail(target, "creating a temporary file", errno);
  try {
    write_all(fd, target, content);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
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
    fail(target, "flushing to disk", sync_error != 0 ? sync_error : close_error);
  }
  return temporary;
}

}  // namespace

void check_output_path(const std::string& path) {
  const Target target = classify(path);
  if (target.write_through) return;
  std::filesystem::path folder = std::filesystem::path(target.path).parent_path();
  if (folder.empty()) folder = ".";
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0) fail(path, "its folder " + folder.string(), errno);
  if (!S_ISDIR(info.st_mode)) refuse(path, fmt::format("{} is not a directory", folder.string()));
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    fail(path, "its folder " + folder.string(), errno);
  }
}

void OutputFiles::add(std::string path, std::string content) {
  files_.emplace_back(std::move(path), std::move(content));
}

void OutputFiles::commit() {
  struct Pending {
    const std::string* path;  // as the user gave it, for messages
    Target target;
    std::string temporary;  // "" for targets written through
    const std::string* content;
  };
  std::vector<Pending> pending;
  auto remove_temporaries = [&pending](size_t from) {
    for (size_t i = from; i < pending.size(); ++i) {
      if (!pending[i].temporary.empty()) ::unlink(pending[i].temporary.c_str());
    }
  };
  try {
    // 1. Every regular output to a flushed temporary file: a full disk stops here.
    for (const auto& [path, content] : files_) {
      pending.push_back({&path, classify(path), "", &content});
      Pending& p = pending.back();
      if (!p.target.write_through) p.temporary = write_temporary(p.target.path, content);
    }
    // 2. Special files, which cannot be taken back, once every temporary file is complete.
    for (const Pending& p : pending) {
      if (p.target.write_through) write_through(p.target.path, *p.content);
    }
  } catch (...) {
    remove_temporaries(0);
    throw;
  }
  // 3. Renames, each atomic.
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& p = pending[i];
    if (p.temporary.empty()) continue;
    if (std::rename(p.temporary.c_str(), p.target.path.c_str()) != 0) {
      const int saved = errno;
      remove_temporaries(i);
      fail(*p.path, "renaming the temporary file into place", saved);
    }
  }
}

void write_file_atomically(const std::string& path, const std::string& content) {
  OutputFiles files;
  files.add(path, content);
  files.commit();
}

}  // namespace dhelix
