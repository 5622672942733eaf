#include "tools/output_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/output_target.h"
#include "lib/text.h"

namespace dhelix {
namespace {

// Who a name stands for: an existing regular file by device and inode, a name not on disk
// by its normalised absolute path. Special files and directories have no identity here.
struct Identity {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  std::string path;

  bool operator==(const Identity& other) const {
    if (exists != other.exists) return false;
    return exists ? device == other.device && inode == other.inode : path == other.path;
  }
};

std::optional<Identity> identity(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (!S_ISREG(info.st_mode)) return std::nullopt;
    return Identity{.exists = true, .device = info.st_dev, .inode = info.st_ino, .path = ""};
  }
  // A dangling link stands for the file it will create (lib/output_target.h).
  const std::string target = follow_links(path);
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::weakly_canonical(target, error);
  return Identity{
      .exists = false, .device = 0, .inode = 0, .path = error ? target : absolute.string()};
}

}  // namespace

void check_output_paths(const std::vector<NamedPath>& outputs,
                        const std::vector<NamedPath>& inputs) {
  std::vector<std::pair<const NamedPath*, Identity>> seen_outputs;
  for (const NamedPath& output : outputs) {
    if (output.path.empty()) continue;
    const std::optional<Identity> id = identity(output.path);
    if (!id) continue;
    for (const NamedPath& input : inputs) {
      if (input.path.empty() || identity(input.path) != id) continue;
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("<flags>: {} {}: is the input {} ({}); writing it would destroy "
                              "the input: choose another output file",
                              output.flag, output.path, input.flag, input.path));
    }
    for (const auto& [other, other_id] : seen_outputs) {
      if (other_id != *id) continue;
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("<flags>: {} {}: is also the output of {} ({}); one output would "
                              "replace the other: give each its own file",
                              output.flag, output.path, other->flag, other->path));
    }
    seen_outputs.emplace_back(&output, *id);
  }
  for (const NamedPath& output : outputs) {
    if (!output.path.empty()) check_output_path(output.path);
  }
}

std::vector<std::string> given_flags(const CLI::App& app, const std::vector<std::string>& flags) {
  std::vector<std::string> given;
  for (const std::string& flag : flags) {
    if (app.count(flag) > 0) given.push_back(flag);
  }
  return given;
}

void refuse_flags_with(const CLI::App& app, const std::string& mode, const std::string& what,
                       const std::vector<std::string>& flags, const std::string& fix) {
  const std::vector<std::string> given = given_flags(app, flags);
  if (given.empty()) return;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("<flags>: {} {}: {} {} not used with it ({})", mode, what,
                          join(given, ", "), given.size() == 1 ? "is" : "are", fix));
}

}  // namespace dhelix
