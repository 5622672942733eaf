// The lock of a checkpoint directory (see checkpoint_lock.h).

#include "runtime/train/checkpoint_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail_io(const std::string& path, const std::string& what, int error) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot {}: {}", path, what, std::strerror(error)));
}

// What the holder wrote into the lock file, on one line ("run 3f2a..., pid 12 on host a"),
// or "" when it has not written it yet.
std::string holder_text(int fd) {
  char buffer[512];
  const ssize_t got = ::pread(fd, buffer, sizeof buffer - 1, 0);
  if (got <= 0) return "";
  std::string text(buffer, static_cast<size_t>(got));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::string line;
  for (const char c : text) {
    if (c == '\n') {
      line += ", ";
    } else {
      line += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return line;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  ::gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

}  // namespace

std::unique_ptr<CheckpointLock> CheckpointLock::take(const std::string& dir,
                                                     const std::string& run_id) {
  std::error_code error;
  bool made_dir = false;
  if (!fs::exists(dir, error)) {
    made_dir = fs::create_directories(dir, error);
    if (error) fail_io(dir, "create checkpoint directory", error.value());
  }
  const std::string path = dir + "/" + kRunLockFile;
  // A lock file removed between our open and our flock is a dead inode: try again. Each
  // round means another run ended just then, so a few rounds are plenty.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // O_NOFOLLOW: a link planted as run.lock is refused (ELOOP); O_NONBLOCK: a FIFO there
    // opens at once and is refused below, not waited on.
    const int fd =
        ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EISDIR && errno != ELOOP) {
      fail_io(path, "open the checkpoint directory's lock file", errno);
    }
    struct stat held {};
    if (fd < 0 || ::fstat(fd, &held) != 0 || !S_ISREG(held.st_mode)) {
      if (fd >= 0) ::close(fd);
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: is not a regular file: the checkpoint directory's lock file "
                              "must be one (remove it)",
                              path));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int saved = errno;
      if (saved != EWOULDBLOCK) {
        ::close(fd);
        fail_io(path, "lock the checkpoint directory", saved);
      }
      const std::string holder = holder_text(fd);
      ::close(fd);
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("{}: the checkpoint directory {} is in use by another dhelix-run "
                              "({}): two runs must not write one --checkpoint-dir; wait until "
                              "it ends or choose another directory",
                              path, dir, holder.empty() ? "starting" : holder));
    }
    struct stat named {};
    if (::stat(path.c_str(), &named) != 0 || named.st_dev != held.st_dev ||
        named.st_ino != held.st_ino) {
      ::close(fd);
      continue;
    }
    const std::string text = fmt::format("run {}\npid {} on host {}\nsince {}\n", run_id,
                                         static_cast<long>(::getpid()), host_name(), utc_now());
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      const int saved = errno;
      ::close(fd);
      fail_io(path, "write the checkpoint directory's lock file", saved);
    }
    return std::unique_ptr<CheckpointLock>(new CheckpointLock(dir, path, fd, made_dir));
  }
  throw Error(ErrorCode::kIo,
              fmt::format("{}: cannot lock the checkpoint directory: the lock file keeps being "
                          "replaced (other runs are starting and ending in it)",
                          path));
}

CheckpointLock::CheckpointLock(std::string dir, std::string path, int fd, bool made_dir)
    : dir_(std::move(dir)), path_(std::move(path)), fd_(fd), made_dir_(made_dir) {}

CheckpointLock::~CheckpointLock() {
  // Unlinked while still locked: a run that opened it meanwhile finds, once it gets the
  // lock, that the path no longer names this file, and tries again.
  ::unlink(path_.c_str());
  ::close(fd_);
  if (made_dir_) {
    std::error_code ignored;  // removes only an empty directory
    fs::remove(dir_, ignored);
  }
}

}  // namespace dhelix::rt
