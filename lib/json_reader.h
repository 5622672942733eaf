#pragma once
// Strict, message-friendly reading of JSON input files.
//
// Every reader of a user file goes through ObjectReader: it reads typed fields,
// checks ranges, and remembers which keys it was asked about, so that finish() can
// reject the remaining (unknown) keys with a "did you mean". Problems are collected
// into a ProblemList instead of thrown, so one run reports every mistake of a file:
//
//   ProblemList problems;
//   ObjectReader root(json, "job.json", "", problems);
//   int64_t tp = root.integer("tp", Need::kOptional, 1, {.min = 1}).value_or(1);
//   root.finish();
//   problems.throw_if_any();

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/error.h"

namespace dhelix {

using Json = nlohmann::json;
/// Keeps keys in insertion order: the tools write files whose key order is stable
/// and chosen by the writer.
using OrderedJson = nlohmann::ordered_json;

/// Reads and parses a JSON file. Throws Error(kIo) when it cannot be read and
/// Error(kInvalidInput) naming line and column when it is not valid JSON.
Json read_json_file(const std::string& path);

/// The bytes of a JSON file, at most 256 MiB (Error(kInvalidInput) beyond: /dev/zero ends
/// in an error, not a hang); Error(kIo) for a directory or a file that cannot be read.
std::string read_json_text(const std::string& path);

/// Parses JSON text; `name` is used in messages. Same errors as read_json_file.
Json parse_json_text(const std::string& text, const std::string& name);

/// Whether a field must be present.
enum class Need { kRequired, kOptional };

/// Inclusive numeric bounds for integer fields.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};

/// Inclusive numeric bounds for real fields. NaN and infinities are always rejected.
struct RealRange {
  double min = -std::numeric_limits<double>::max();
  double max = std::numeric_limits<double>::max();
  bool min_exclusive = false;  ///< true: value must be > min (e.g. bandwidths)
};

/// Reads one JSON object's fields, collecting problems (see the file comment).
class ObjectReader {
 public:
  /// `pointer` is the JSON pointer of `value` within `file` ("" for the root).
  /// When `value` is not an object a problem is recorded and every getter returns nothing.
  ObjectReader(const Json& value, std::string file, std::string pointer, ProblemList& problems);

  bool is_object() const { return is_object_; }
  bool has(const std::string& key) const;

  std::optional<int64_t> integer(const std::string& key, Need need, IntRange range = {});
  std::optional<double> real(const std::string& key, Need need, RealRange range = {});
  std::optional<bool> boolean(const std::string& key, Need need);
  /// A string field; when `allowed` is non-empty the value must be one of them.
  std::optional<std::string> string(const std::string& key, Need need,
                                    const std::vector<std::string>& allowed = {});
  /// A nested object as a new reader (whose unknown keys the caller checks with finish()).
  std::optional<ObjectReader> object(const std::string& key, Need need);
  /// Any JSON value, marked as known; nullptr when absent.
  const Json* raw(const std::string& key, Need need);
  /// Marks a key as known without reading it (e.g. "$schema", "comment").
  void allow(const std::string& key);

  /// Records an unknown-key problem for every key no getter asked about.
  void finish();

  /// JSON pointer of a child key, escaped per RFC 6901.
  std::string pointer_of(const std::string& key) const;
  const std::string& file() const { return file_; }
  const std::string& pointer() const { return pointer_; }
  ProblemList& problems() { return *problems_; }
  /// Records a problem about one of this object's keys.
  void report(const std::string& key, const std::string& value, const std::string& rule);

 private:
  const Json* find(const std::string& key, Need need);

  const Json* value_;
  std::string file_;
  std::string pointer_;
  ProblemList* problems_;
  bool is_object_;
  std::vector<std::string> known_keys_;
};

/// A JSON value as short text for messages (strings quoted, long values cut).
std::string json_value_text(const Json& value);

/// Checks "schema_version" ("major.minor.patch") against the major version a reader
/// understands. A missing field is a problem; another major version throws
/// Error(kSchemaVersion) at once, as nothing else in the file can be trusted.
void check_schema_version(ObjectReader& root, int supported_major);

}  // namespace dhelix
