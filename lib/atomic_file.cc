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
#include "lib/output_target.h"

namespace dhelix {
namespace {

void write_all(int fd, const std::string& path, const std::string& content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_write_error(path, "writing", errno);
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
  const int fd = open_write_through(path);
  try {
    write_all(fd, path, content);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_write_error(path, "closing", errno);
}

// Writes `content` to a new temporary file beside the target and flushes it to disk; returns
// its name. On failure nothing is left behind.
std::string write_temporary(const OutputTarget& target, const std::string& content) {
  // The temporary file lives in the same directory so that rename() stays atomic.
  std::string temporary = target.path + ".tmp.XXXXXX";
  const int fd = mkstemp(temporary.data());
  if (fd < 0) throw_write_error(target.path, "creating a temporary file", errno);
  try {
    write_all(fd, target.path, content);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (target.exists) {
    // A file replaced keeps its mode (a 0600 plan stays private) and, where the process may
    // give it (root), its owner, as the shell's `>` would leave them.
    if (::geteuid() == 0) (void)::fchown(fd, target.owner, target.group);
    ::fchmod(fd, target.mode);
  } else {
    // mkstemp creates the file 0600; new output files get the mode open(O_CREAT, 0666)
    // would give them, which honours the user's umask. POSIX can only read the umask by
    // setting it, so it is set back at once (the tools write files from one thread).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
  }
  // close() even when fsync() fails, so the descriptor never leaks.
  const int sync_error = ::fsync(fd) != 0 ? errno : 0;
  const int close_error = ::close(fd) != 0 ? errno : 0;
  if (sync_error != 0 || close_error != 0) {
    ::unlink(temporary.c_str());
    throw_write_error(target.path, "flushing to disk", sync_error != 0 ? sync_error : close_error);
  }
  return temporary;
}

}  // namespace

void check_output_path(const std::string& path) {
  const OutputTarget target = resolve_output_target(path);
  if (target.write_through) return;
  std::filesystem::path folder = std::filesystem::path(target.path).parent_path();
  if (folder.empty()) folder = ".";
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0)
    throw_write_error(path, "its folder " + folder.string(), errno);
  if (!S_ISDIR(info.st_mode))
    throw_write_refusal(path, fmt::format("{} is not a directory", folder.string()));
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw_write_error(path, "its folder " + folder.string(), errno);
  }
}

void OutputFiles::add(std::string path, std::string content) {
  files_.emplace_back(std::move(path), std::move(content));
}

void OutputFiles::commit() {
  struct Pending {
    const std::string* path;  // as the user gave it, for messages
    OutputTarget target;
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
      pending.push_back({&path, resolve_output_target(path), "", &content});
      Pending& p = pending.back();
      if (!p.target.write_through) p.temporary = write_temporary(p.target, content);
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
      throw_write_error(*p.path, "renaming the temporary file into place", saved);
    }
  }
}

void write_file_atomically(const std::string& path, const std::string& content) {
  OutputFiles files;
  files.add(path, content);
  files.commit();
}

}  // namespace dhelix
