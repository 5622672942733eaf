#pragma once
// One run per checkpoint directory. Two runs writing one --checkpoint-dir at once would
// publish each other's steps and mix their shards; so rank 0 of a run takes an exclusive
// flock(2) on <dir>/run.lock at start and holds it for the run's life. A second run finds
// it held and is refused at start, naming the run that holds it (the file says which run,
// process and host). The kernel drops the lock when its process ends, however it ends:
// a crashed or killed run never blocks the next one.
//
// The file is removed when the run ends normally. Removing a lock file is safe only because
// a taker checks, once it holds the lock, that the path still names the file it locked
// (otherwise it locked a removed file and tries again).

#include <memory>
#include <string>

namespace dhelix::rt {

/// The name of the lock file inside a checkpoint directory.
inline constexpr const char* kRunLockFile = "run.lock";

class CheckpointLock {
 public:
  /// Takes <dir>/run.lock, creating `dir` when it does not exist, and writes `run_id`, the
  /// process id, host and time into it. Error(kInvalidInput) naming the lock file and the
  /// run holding it when another process holds it; Error(kIo) naming the path when the
  /// directory or file cannot be made or locked (run.lock a directory, a FIFO, a link).
  static std::unique_ptr<CheckpointLock> take(const std::string& dir, const std::string& run_id);

  /// Removes the lock file, then unlocks it; removes `dir` too when take() made it and it
  /// is still empty (a run that failed before its first checkpoint leaves nothing).
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  CheckpointLock(std::string dir, std::string path, int fd, bool made_dir);

  std::string dir_;
  std::string path_;
  int fd_;
  bool made_dir_;
};

}  // namespace dhelix::rt
