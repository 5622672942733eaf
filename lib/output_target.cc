#include "lib/output_target.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

// How long an output FIFO may wait for its reader to open it.
constexpr int kFifoGraceMs = 2000;
constexpr int kFifoPollMs = 10;
// Linux follows at most 40 links in one path (ELOOP); a chain this long is a loop.
constexpr int kMaxLinks = 40;

bool under_system_folder(const std::string& path) {
  return path.starts_with("/dev/") || path.starts_with("/proc/");
}

// The end of the chain of links at `path`; nothing on a loop.
std::optional<std::string> end_of_links(const std::string& path) {
  std::filesystem::path current = path;
  for (int hops = 0; hops < kMaxLinks; ++hops) {
    std::error_code error;
    if (!std::filesystem::is_symlink(current, error)) return current.string();
    const std::filesystem::path next = std::filesystem::read_symlink(current, error);
    if (error) return current.string();
    // A relative link is relative to the folder that holds it.
    current = next.is_absolute() ? next : current.parent_path() / next;
  }
  return std::nullopt;
}

// See the file comment: root's answer from the bits, everyone else's from access(2).
bool write_protected(const std::string& path, const struct stat& info) {
  if (::geteuid() == 0) return (info.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0;
  return ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0 &&
         (errno == EACCES || errno == EPERM);
}

// An output whose path exists (`info` is stat(2) of `path`, links followed).
OutputTarget existing_target(const std::string& path, const struct stat& info) {
  if (S_ISDIR(info.st_mode)) throw_write_refusal(path, "is a directory, expected a file");
  if (S_ISBLK(info.st_mode))
    throw_write_refusal(path, "is a block device; dhelix never writes one");
  if (S_ISSOCK(info.st_mode)) throw_write_refusal(path, "is a socket, expected a file");
  if (S_ISCHR(info.st_mode) || S_ISFIFO(info.st_mode)) return {.path = path, .write_through = true};
  // A regular file behind /dev/stdout or /proc/self/fd/N belongs to whoever opened it.
  if (under_system_folder(path)) return {.path = path, .write_through = true};
  std::string resolved = path;
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code error;
    resolved = std::filesystem::canonical(path, error).string();
    if (error) throw_write_error(path, "resolving the symbolic link", error.value());
  }
  if (write_protected(resolved, info)) {
    throw_write_refusal(
        path, fmt::format("{} read-only; dhelix does not overwrite a file without write "
                          "permission (make it writable, e.g. chmod u+w, or choose another "
                          "file)",
                          resolved == path ? "is" : "links to " + resolved + ", which is"));
  }
  return {.path = resolved,
          .write_through = false,
          .exists = true,
          .mode = static_cast<mode_t>(info.st_mode & 07777),
          .owner = info.st_uid,
          .group = info.st_gid};
}

}  // namespace

void throw_write_error(const std::string& path, const std::string& what, int error_number) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot write file: {}: {}", path, what,
                                          std::strerror(error_number)));
}

void throw_write_refusal(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot write file: {}", path, why));
}

OutputTarget resolve_output_target(const std::string& path) {
  if (path.empty()) throw_write_refusal(path, "the file name is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) return existing_target(path, info);
  if (errno != ENOENT) throw_write_error(path, "looking at the target", errno);
  // Nothing is there, or a dangling link: the file goes where the last link points, so
  // that the link is kept and its target written (replacing the link lost both).
  const std::optional<std::string> end = end_of_links(path);
  if (!end) throw_write_error(path, "resolving the symbolic link", ELOOP);
  if (*end != path && ::stat(end->c_str(), &info) == 0) return existing_target(path, info);
  return {.path = *end, .write_through = false};
}

std::string follow_links(const std::string& path) { return end_of_links(path).value_or(path); }

int open_write_through(const std::string& path) {
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
      throw_write_refusal(path, fmt::format("is a FIFO that no process is reading (waited {} s)",
                                            kFifoGraceMs / 1000));
    }
    throw_write_error(path, "opening", errno);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace dhelix
