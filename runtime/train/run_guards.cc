#include "runtime/train/run_guards.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/error.h"
#include "runtime/train/checkpoint.h"

namespace dhelix::rt {
namespace {

// Written by the signal handler, read by the training loop: the one global this needs.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal) { g_stop_signal = signal; }

[[noreturn]] void refuse(ErrorCode code, const std::string& message) { throw Error(code, message); }

bool same_regular_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (a.empty() || b.empty() || ::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) {
    return false;
  }
  return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_checkpoint_dir(const TrainOptions& options) {
  const std::string& dir = options.checkpoint_dir;
  if (dir.empty()) {
    if (options.checkpoint_every > 0) {
      refuse(ErrorCode::kInvalidInput,
             "<flags>: --checkpoint-every needs --checkpoint-dir (where the checkpoints go)");
    }
    if (options.resume) {
      refuse(ErrorCode::kInvalidInput, "<flags>: --resume needs --checkpoint-dir");
    }
    return;
  }
  // A folder that does not exist yet is made at the first checkpoint (a run that fails to
  // start leaves nothing behind); its nearest existing ancestor is checked instead.
  std::error_code error;
  std::filesystem::path probe_dir = dir;
  while (!std::filesystem::exists(probe_dir, error)) {
    const std::filesystem::path parent = probe_dir.parent_path();
    if (parent == probe_dir) break;
    probe_dir = parent.empty() ? std::filesystem::path(".") : parent;
  }
  if (!std::filesystem::is_directory(probe_dir, error)) {
    refuse(ErrorCode::kIo,
           fmt::format("--checkpoint-dir {}: {} is not a directory (checkpoints are folders of "
                       "files)",
                       dir, probe_dir.string() == dir ? "it" : probe_dir.string()));
  }
  // A probe file, not access(2): it also finds read-only file systems and full quotas,
  // and root passes every permission check.
  std::string probe = probe_dir.string() + "/.dhelix-write-probe.XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    refuse(ErrorCode::kIo, fmt::format("--checkpoint-dir {}: cannot write in {}: {}", dir,
                                       probe_dir.string(), std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  if (!options.resume) return;
  const std::optional<int64_t> step = latest_step(dir);
  if (step && *step >= options.steps) {
    refuse(ErrorCode::kInvalidInput,
           fmt::format("--steps {}: the checkpoint in {} is at step {} already, so --resume "
                       "would run nothing; --steps counts all steps, the resumed ones "
                       "included: ask for more (e.g. --steps {})",
                       options.steps, dir, *step, *step + options.steps));
  }
}

void check_loss_log(const TrainOptions& options) {
  const std::string& log = options.loss_log;
  if (log.empty()) return;
  for (const auto& [flag, input] :
       {std::pair{"--plan", &options.plan_file}, std::pair{"--job", &options.job_file},
        std::pair{"--data", &options.data_file}}) {
    if (same_regular_file(log, *input)) {
      refuse(ErrorCode::kInvalidInput,
             fmt::format("--loss-log {}: is the input {} ({}); appending the losses would "
                         "destroy it: choose another file",
                         log, flag, *input));
    }
  }
  struct stat info {};
  if (::stat(log.c_str(), &info) != 0) {
    const std::filesystem::path folder = std::filesystem::path(log).parent_path();
    std::error_code error;
    if (!folder.empty() && !std::filesystem::is_directory(folder, error)) {
      refuse(ErrorCode::kIo,
             fmt::format("--loss-log {}: its folder {} does not exist", log, folder.string()));
    }
    check_output_path(log);  // a dangling link: where it points must take a file
    return;
  }
  if (S_ISDIR(info.st_mode)) {
    refuse(ErrorCode::kIo, fmt::format("--loss-log {}: is a directory, expected a file", log));
  }
  // The rules of every output (lib/output_target.h): a read-only log is not appended to.
  check_output_path(log);
  if (!S_ISREG(info.st_mode)) return;  // /dev/null, a FIFO, a terminal: written through
  // Every line dhelix-run writes starts so (Trainer::report).
  const std::string prefix = "{\"step\": ";
  std::ifstream in(log, std::ios::binary);
  std::string first(prefix.size(), '\0');
  in.read(first.data(), static_cast<std::streamsize>(first.size()));
  first.resize(static_cast<size_t>(in.gcount()));
  if (!first.empty() && first != prefix) {
    refuse(ErrorCode::kInvalidInput,
           fmt::format("--loss-log {}: is not a loss log (its first line does not start with "
                       "{{\"step\": ); dhelix-run appends to the file and would damage it: "
                       "choose another file",
                       log));
  }
}

}  // namespace

// --trace is written once, after the last step: a path that cannot work is refused before
// training rather than after it.
void check_trace_file(const TrainOptions& options) {
  const std::string& trace = options.trace_file;
  if (trace.empty()) return;
  for (const auto& [flag, input] :
       {std::pair{"--plan", &options.plan_file}, std::pair{"--job", &options.job_file},
        std::pair{"--data", &options.data_file}, std::pair{"--loss-log", &options.loss_log}}) {
    if (same_regular_file(trace, *input)) {
      refuse(ErrorCode::kInvalidInput,
             fmt::format("--trace {}: is the file of {} ({}): choose another file", trace, flag,
                         *input));
    }
  }
  std::error_code error;
  if (std::filesystem::is_directory(trace, error)) {
    refuse(ErrorCode::kIo, fmt::format("--trace {}: is a directory, expected a file", trace));
  }
  const std::filesystem::path folder = std::filesystem::path(trace).parent_path();
  if (!folder.empty() && !std::filesystem::is_directory(folder, error)) {
    refuse(ErrorCode::kIo,
           fmt::format("--trace {}: its folder {} does not exist", trace, folder.string()));
  }
  // The rules of every output (lib/output_target.h): read-only files, dangling links.
  check_output_path(trace);
}

void check_run_options(const TrainOptions& options) {
  check_checkpoint_dir(options);
  check_loss_log(options);
  check_trace_file(options);
}

std::optional<int64_t> first_non_finite_loss(const std::vector<float>& losses) {
  for (size_t mb = 0; mb < losses.size(); ++mb) {
    if (!std::isfinite(losses[mb])) return static_cast<int64_t>(mb);
  }
  return std::nullopt;
}

std::optional<std::string> first_non_finite_gradient(const std::vector<std::string>& names,
                                                     const std::vector<std::vector<float>>& grads) {
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < grads[t].size(); ++i) {
      if (std::isfinite(grads[t][i])) continue;
      return fmt::format("the gradient of {} (element {}) is {}", t < names.size() ? names[t] : "?",
                         i, grads[t][i]);
    }
  }
  return std::nullopt;
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocking read or collective carries on
  ::sigaction(SIGINT, &action, &previous_int_);
  ::sigaction(SIGTERM, &action, &previous_term_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &previous_int_, nullptr);
  ::sigaction(SIGTERM, &previous_term_, nullptr);
}

int StopSignals::received() { return g_stop_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace dhelix::rt
