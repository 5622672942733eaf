#pragma once
// Checks a tool makes on its file names before any work, so that an output never replaces
// an input or another output of the same command (docs/reliability.md):
//
//   dhelix-plan job.json -o job.json            -o is the job: refused
//   dhelix-plan job.json -o x.json --trace x.json   two outputs, one file: refused
//   dhelix-plan job.json -o /dev/null           a special file is written through: allowed
//
// Files are compared by identity (device and inode, through symbolic and hard links), and
// names not on disk yet by their absolute, normalised path. Special files (character
// devices, FIFOs) are exempt: they are written through, never replaced (lib/atomic_file.h).
// Then each output must be writable at all (lib/atomic_file.h check_output_path).

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dhelix {

/// A file a command reads or writes, with the flag (or positional name) that named it.
struct NamedPath {
  std::string flag;  ///< "-o", "--trace", "JOB", "/model of job.json"
  std::string path;
};

/// Throws Error(kInvalidInput) when an output is the same file as an input or as another
/// output, naming both flags and the file, and Error(kIo) when an output cannot be written
/// (a directory, a missing folder). Empty paths are skipped.
void check_output_paths(const std::vector<NamedPath>& outputs,
                        const std::vector<NamedPath>& inputs);

/// The flags of `given` that were given on the command line (app.count > 0), in order.
std::vector<std::string> given_flags(const CLI::App& app, const std::vector<std::string>& given);

/// Throws Error(kInvalidInput) when any of `flags` was given with `mode`:
/// "<flags>: --check reads a plan only: JOB and -o are not used with it (<fix>)".
void refuse_flags_with(const CLI::App& app, const std::string& mode, const std::string& what,
                       const std::vector<std::string>& flags, const std::string& fix);

}  // namespace dhelix
