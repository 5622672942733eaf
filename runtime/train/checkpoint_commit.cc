// manifest.json and the commit protocol of checkpoint directories (see checkpoint.h).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/file_kind.h"
#include "runtime/train/checkpoint.h"

namespace dhelix::rt {
namespace {

namespace fs = std::filesystem;

constexpr int kManifestSchemaMajor = 2;
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kLatestFile = "latest";

[[noreturn]] void fail_io(const std::string& path, const std::string& what,
                          const std::error_code& error) {
  throw Error(ErrorCode::kIo, fmt::format("{}: cannot {}: {}", path, what, error.message()));
}

// The step of a directory entry named "step-<N><suffix>", N decimal without sign or
// leading zeros (so that one step has exactly one name).
std::optional<int64_t> parse_step_name(std::string_view name, std::string_view suffix) {
  constexpr std::string_view kPrefix = "step-";
  if (!name.starts_with(kPrefix) || !name.ends_with(suffix)) return std::nullopt;
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

// Makes renames inside `dir` durable: without it a power loss after publish_step could
// bring back the old directory entries although `latest` was already replaced.
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail_io(dir, "open directory to sync it", {errno, std::generic_category()});
  // Some file systems cannot sync a directory (EINVAL); their renames are as durable as
  // they get.
  const int sync_error = ::fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  ::close(fd);
  if (sync_error != 0) fail_io(dir, "sync directory", {sync_error, std::generic_category()});
}

void remove_tree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) fail_io(path, "remove", error);
}

void rename_path(const std::string& from, const std::string& to) {
  std::error_code error;
  fs::rename(from, to, error);
  if (error) fail_io(from, "rename to " + to, error);
}

bool exists(const std::string& path) {
  std::error_code error;
  return fs::exists(path, error);
}

void read_manifest_shards(ObjectReader& root, CheckpointManifest& manifest) {
  const Json* shards = root.raw("shards", Need::kRequired);
  if (shards == nullptr) return;
  if (!shards->is_array()) {
    root.report("shards", json_value_text(*shards), "must be an array");
    return;
  }
  for (size_t i = 0; i < shards->size(); ++i) {
    const std::string pointer = fmt::format("{}/{}", root.pointer_of("shards"), i);
    ObjectReader entry((*shards)[i], root.file(), pointer, root.problems());
    ManifestShard shard;
    const auto index = static_cast<int64_t>(i);
    shard.rank = entry.integer("rank", Need::kRequired, {.min = 0}).value_or(index);
    shard.file = entry.string("file", Need::kRequired).value_or(rank_shard_file_name(index));
    shard.bytes = entry.integer("bytes", Need::kRequired, {.min = 0}).value_or(0);
    entry.finish();
    if (shard.rank != index) {
      entry.report("rank", std::to_string(shard.rank),
                   fmt::format("must be {}: shards are listed in rank order", index));
    } else if (shard.file != rank_shard_file_name(index)) {
      entry.report("file", json_value_text(Json(shard.file)),
                   fmt::format("must be \"{}\"", rank_shard_file_name(index)));
    }
    manifest.shards.push_back(std::move(shard));
  }
  if (static_cast<int64_t>(manifest.shards.size()) != manifest.world_size) {
    root.report("shards", fmt::format("{} entries", manifest.shards.size()),
                fmt::format("must list one shard per rank (world_size = {})", manifest.world_size));
  }
}

}  // namespace

std::string step_dir(const std::string& dir, int64_t step) {
  return fmt::format("{}/step-{}", dir, step);
}

std::string temporary_step_dir(const std::string& dir, int64_t step) {
  return step_dir(dir, step) + ".tmp";
}

std::string prepare_temporary_step_dir(const std::string& dir, int64_t step) {
  DHELIX_CHECK(step >= 0);
  const std::string temporary = temporary_step_dir(dir, step);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) fail_io(dir, "create checkpoint directory", error);
  remove_tree(temporary);
  fs::create_directory(temporary, error);
  if (error) fail_io(temporary, "create directory", error);
  return temporary;
}

CheckpointManifest make_manifest(const std::string& step_dir_path, const std::string& job,
                                 int64_t step, int64_t world_size, const std::string& plan_sha256,
                                 const std::string& run_id) {
  CheckpointManifest manifest;
  manifest.job = job;
  manifest.step = step;
  manifest.world_size = world_size;
  manifest.plan_sha256 = plan_sha256;
  manifest.run_id = run_id;
  for (int64_t rank = 0; rank < world_size; ++rank) {
    const std::string file = rank_shard_file_name(rank);
    std::error_code error;
    const uintmax_t bytes = fs::file_size(step_dir_path + "/" + file, error);
    if (error) fail_io(step_dir_path + "/" + file, "read the size of checkpoint shard", error);
    manifest.shards.push_back({rank, file, static_cast<int64_t>(bytes)});
  }
  return manifest;
}

OrderedJson manifest_to_json(const CheckpointManifest& manifest) {
  OrderedJson root = OrderedJson::object();
  root["schema_version"] = manifest.schema_version;
  root["meta"] = manifest.meta;
  root["job"] = manifest.job;
  root["step"] = manifest.step;
  root["world_size"] = manifest.world_size;
  root["plan_sha256"] = manifest.plan_sha256;
  root["run_id"] = manifest.run_id;
  root["shard_format_version"] = manifest.shard_format_version;
  OrderedJson shards = OrderedJson::array();
  for (const ManifestShard& shard : manifest.shards) {
    OrderedJson entry = OrderedJson::object();
    entry["rank"] = shard.rank;
    entry["file"] = shard.file;
    entry["bytes"] = shard.bytes;
    shards.push_back(std::move(entry));
  }
  root["shards"] = std::move(shards);
  return root;
}

void write_manifest(const std::string& step_dir_path, const CheckpointManifest& manifest) {
  write_file_atomically(step_dir_path + "/" + kManifestFile,
                        manifest_to_json(manifest).dump(2) + "\n");
}

CheckpointManifest read_manifest(const std::string& path) {
  const Json json = parse_json_text(read_checkpoint_file(path, "checkpoint manifest"), path);
  require_file_kind(json, path, FileKind::kCheckpointManifest);
  ProblemList problems;
  ObjectReader root(json, path, "", problems);
  if (!root.is_object()) problems.throw_if_any();
  root.allow("$schema");
  check_schema_version(root, kManifestSchemaMajor);
  CheckpointManifest manifest;
  manifest.schema_version = root.string("schema_version", Need::kRequired).value_or("");
  if (const Json* meta = root.raw("meta", Need::kRequired)) {
    if (meta->is_object()) {
      manifest.meta = OrderedJson::parse(meta->dump());
    } else {
      root.report("meta", json_value_text(*meta), "must be an object");
    }
  }
  manifest.job = root.string("job", Need::kRequired).value_or("");
  manifest.step = root.integer("step", Need::kRequired, {.min = 0}).value_or(0);
  manifest.world_size = root.integer("world_size", Need::kRequired, {.min = 1}).value_or(0);
  manifest.plan_sha256 = root.string("plan_sha256", Need::kRequired).value_or("");
  if (root.has("plan_sha256") && !manifest.plan_sha256.empty() &&
      !is_lower_hex(manifest.plan_sha256, 64)) {
    root.report("plan_sha256", json_value_text(Json(manifest.plan_sha256)),
                "must be 64 lowercase hexadecimal digits (a SHA-256)");
  }
  manifest.run_id = root.string("run_id", Need::kRequired).value_or("");
  if (root.has("run_id") && !is_lower_hex(manifest.run_id, kRunIdDigits)) {
    root.report("run_id", json_value_text(Json(manifest.run_id)),
                fmt::format("must be {} lowercase hexadecimal digits", kRunIdDigits));
  }
  manifest.shard_format_version =
      root.integer("shard_format_version", Need::kRequired).value_or(kShardFormatVersion);
  if (manifest.shard_format_version != kShardFormatVersion) {
    root.report("shard_format_version", std::to_string(manifest.shard_format_version),
                fmt::format("is not the shard format this dhelix reads ({})", kShardFormatVersion));
  }
  read_manifest_shards(root, manifest);
  root.finish();
  problems.throw_if_any();
  return manifest;
}

void check_manifest_shards(const std::string& step_dir_path, const CheckpointManifest& manifest) {
  ProblemList problems;
  for (const ManifestShard& shard : manifest.shards) {
    const std::string path = step_dir_path + "/" + shard.file;
    std::error_code error;
    const fs::file_status status = fs::symlink_status(path, error);
    if (status.type() == fs::file_type::not_found) {
      problems.add(path, "", "", "is missing: the checkpoint is incomplete");
      continue;
    }
    if (!fs::is_regular_file(fs::status(path, error))) {
      problems.add(path, "", "", "is not a regular file: a checkpoint shard must be one");
      continue;
    }
    const uintmax_t bytes = fs::file_size(path, error);
    if (error) {
      problems.add(path, "", "", "cannot be read: " + error.message());
    } else if (static_cast<int64_t>(bytes) != shard.bytes) {
      problems.add(path, "", fmt::format("{} bytes", bytes),
                   fmt::format("differ from the {} bytes manifest.json lists", shard.bytes));
    }
  }
  problems.throw_if_any();
}

void check_resume_matches(const CheckpointManifest& manifest, const std::string& manifest_file,
                          const std::string& job, int64_t world_size,
                          const std::string& plan_sha256) {
  ProblemList problems;
  if (manifest.world_size != world_size) {
    problems.add(manifest_file, "/world_size", std::to_string(manifest.world_size),
                 fmt::format("differs from this run's {} ranks", world_size));
  }
  if (manifest.plan_sha256 != plan_sha256) {
    problems.add(manifest_file, "/plan_sha256", manifest.plan_sha256,
                 fmt::format("differs from this run's plan ({}): the checkpoint was written "
                             "under another plan",
                             plan_sha256));
  }
  if (manifest.job != job) {
    problems.add(manifest_file, "/job", json_value_text(Json(manifest.job)),
                 fmt::format("differs from this run's job \"{}\"", job));
  }
  problems.throw_if_any();
}

void publish_step(const std::string& dir, int64_t step) {
  const std::string temporary = temporary_step_dir(dir, step);
  const std::string final_dir = step_dir(dir, step);
  const std::string aside = final_dir + ".old";
  if (!fs::is_directory(temporary)) {
    throw Error(
        ErrorCode::kIo,
        fmt::format("{}: cannot publish checkpoint: the directory does not exist", temporary));
  }
  // A re-run of a step: the old directory moves aside rather than being deleted first, so
  // that a crash before the new one is in place leaves a copy remove_stale_temporaries()
  // restores.
  const bool replacing = exists(final_dir);
  if (replacing) {
    remove_tree(aside);
    rename_path(final_dir, aside);
  }
  rename_path(temporary, final_dir);
  sync_directory(dir);
  write_file_atomically(dir + "/" + kLatestFile, fmt::format("step-{}\n", step));
  sync_directory(dir);
  if (replacing) remove_tree(aside);
}

std::optional<int64_t> latest_step(const std::string& dir) {
  const std::string path = dir + "/" + kLatestFile;
  std::error_code error;
  if (fs::symlink_status(path, error).type() == fs::file_type::not_found) return std::nullopt;
  // At most a few bytes are expected: a long text is reported cut (json_value_text).
  std::string text = read_checkpoint_file(path, "checkpoint's latest file (\"step-<N>\")");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::optional<int64_t> step = parse_step_name(text, "");
  if (!step) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: {} does not name a checkpoint; it must hold \"step-<N>\"", path,
                            json_value_text(Json(text))));
  }
  const std::string manifest = step_dir(dir, *step) + "/" + kManifestFile;
  if (fs::symlink_status(manifest, error).type() == fs::file_type::not_found) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: names step-{}, but {} does not exist", path, *step, manifest));
  }
  return step;
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> cleaned;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return cleaned;
  std::vector<fs::path> entries;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    entries.push_back(entry.path());
  }
  if (error) fail_io(dir, "list checkpoint directory", error);
  std::sort(entries.begin(), entries.end());
  for (const fs::path& entry : entries) {
    const std::string name = entry.filename().string();
    const std::string path = entry.string();
    if (parse_step_name(name, ".tmp") || name.starts_with("latest.tmp.")) {
      remove_tree(path);
      cleaned.push_back(path);
    } else if (const std::optional<int64_t> step = parse_step_name(name, ".old")) {
      if (exists(step_dir(dir, *step))) {
        remove_tree(path);
      } else {
        rename_path(path, step_dir(dir, *step));
      }
      cleaned.push_back(path);
    }
  }
  if (!cleaned.empty()) sync_directory(dir);
  return cleaned;
}

}  // namespace dhelix::rt
