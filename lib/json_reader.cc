#include "lib/json_reader.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "lib/did_you_mean.h"
#include "lib/input_file.h"
#include "lib/json_difference.h"

namespace dhelix {
namespace {

// Line and column (1-based) of a byte offset, for parse errors.
std::pair<int, int> line_and_column(const std::string& text, size_t offset) {
  int line = 1;
  int column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 3, column 8:
// syntax error while parsing value - invalid string: missing closing quote; last read: '"ab'".
// The reason follows the first ": " after the position; the "last read" tail repeats the
// input (which the line and column already locate) and can be long.
std::string parse_error_reason(const std::string& message) {
  std::string reason = message;
  const size_t at = reason.find("parse error");
  const size_t colon = reason.find(": ", at == std::string::npos ? 0 : at);
  if (colon != std::string::npos) reason = reason.substr(colon + 2);
  const size_t tail = reason.find("; last read:");
  if (tail != std::string::npos) reason.resize(tail);
  return reason;
}

// One "major.minor.patch" component: digits only, fitting in an int.
std::optional<int> version_component(std::string_view text) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return std::nullopt;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// Deeper nesting than any dhelix file needs (they nest under 10 levels). nlohmann parses
// deep nesting without recursion, but copying, comparing and dumping a value recurse once
// per level: a 1 MB file of '[' overflowed the stack of dhelix-plan (found while fuzzing).
constexpr int kMaxJsonDepth = 512;

// The most bytes read_json_file reads: far above any dhelix file (the largest plans are a few
// MB), and a bound on what /dev/zero or a runaway FIFO can make a tool read.
constexpr size_t kMaxJsonFileBytes = size_t{256} << 20;

// What the parser accepts but dhelix refuses, found by one pass over text nlohmann has
// already parsed (so it is valid JSON): arrays and objects nested too deep, and an object
// naming a key twice (nlohmann keeps the last value silently: "tp": 4, "tp": 8 meant 8).
class StructureScan {
 public:
  StructureScan(const std::string& text, const std::string& name) : text_(text), name_(name) {}

  void run() {
    for (size_t i = 0; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == '"') {
        i = string_end(i);
      } else if (c == '[' || c == '{') {
        if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
          fail_at(i, fmt::format("arrays and objects nest more than {} deep", kMaxJsonDepth));
        }
        frames_.push_back({.object = c == '{', .index = 0, .key = "", .keys = {}});
      } else if (c == ']' || c == '}') {
        if (!frames_.empty()) frames_.pop_back();
      } else if (c == ',' && !frames_.empty() && !frames_.back().object) {
        ++frames_.back().index;
      }
    }
  }

 private:
  struct Frame {
    bool object = false;
    int64_t index = 0;                             // arrays: the element being read
    std::string key;                               // objects: the member being read
    std::unordered_map<std::string, size_t> keys;  // objects: key -> offset of its quote
  };

  // Offset of the closing quote of the string opening at `start`; records a key.
  size_t string_end(size_t start) {
    size_t end = start + 1;
    bool escaped = false;
    for (; end < text_.size(); ++end) {
      if (escaped) {
        escaped = false;
      } else if (text_[end] == '\\') {
        escaped = true;
      } else if (text_[end] == '"') {
        break;
      }
    }
    if (!frames_.empty() && frames_.back().object && followed_by_colon(end + 1)) {
      record_key(start, end);
    }
    return end;
  }

  bool followed_by_colon(size_t from) const {
    while (from < text_.size() && std::isspace(static_cast<unsigned char>(text_[from]))) ++from;
    return from < text_.size() && text_[from] == ':';
  }

  void record_key(size_t start, size_t end) {
    const std::string quoted = text_.substr(start, end - start + 1);
    // Escapes ("\u0074p" is "tp") are decoded by the parser itself.
    std::string key = quoted.find('\\') == std::string::npos
                          ? quoted.substr(1, quoted.size() - 2)
                          : Json::parse(quoted).get<std::string>();
    Frame& frame = frames_.back();
    frame.key = key;
    const auto [it, inserted] = frame.keys.try_emplace(std::move(key), start);
    if (inserted) return;
    const auto [line, column] = line_and_column(text_, it->second);
    fail_at(start, fmt::format("{}: duplicate key (first at line {}, column {}); each key may "
                               "appear once in an object",
                               pointer(), line, column));
  }

  // JSON pointer of the member or element being read.
  std::string pointer() const {
    std::string out;
    for (const Frame& frame : frames_) {
      out += "/" + (frame.object ? json_pointer_token(frame.key) : std::to_string(frame.index));
    }
    return out;
  }

  [[noreturn]] void fail_at(size_t offset, const std::string& what) const {
    const auto [line, column] = line_and_column(text_, offset);
    throw Error(ErrorCode::kInvalidInput, fmt::format("{}:{}:{}: {}", name_, line, column, what));
  }

  const std::string& text_;
  const std::string& name_;
  std::vector<Frame> frames_;
};

const char* type_name(const Json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  return value.type_name();
}

}  // namespace

Json parse_json_text(const std::string& text, const std::string& name) {
  try {
    Json json = Json::parse(text);
    StructureScan(text, name).run();
    return json;
  } catch (const Json::parse_error& error) {
    auto [line, column] = line_and_column(text, error.byte == 0 ? 0 : error.byte - 1);
    throw Error(ErrorCode::kInvalidInput, fmt::format("{}:{}:{}: not valid JSON: {}", name, line,
                                                      column, parse_error_reason(error.what())));
  } catch (const Json::exception& error) {
    // A number beyond a double (1e400) is out_of_range.406, not a parse_error, and carries
    // no position: the message keeps nlohmann's reason without its "[json.exception...]" tag.
    std::string reason = error.what();
    const size_t tag_end = reason.find("] ");
    if (tag_end != std::string::npos) reason = reason.substr(tag_end + 2);
    throw Error(ErrorCode::kInvalidInput, fmt::format("{}: not valid JSON: {}", name, reason));
  }
}

std::string read_json_text(const std::string& path) {
  auto too_large = [&path](uint64_t size) {
    if (size <= kMaxJsonFileBytes) return;
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: is larger than {} MiB, the most dhelix reads from a JSON file",
                            path, kMaxJsonFileBytes >> 20));
  };
  // A regular file only (lib/input_file.h): a directory, a FIFO or /dev/zero is refused
  // before it is opened, so that no input can make a tool wait forever.
  std::string text = read_input_file(path, too_large);
  too_large(text.size());  // a file that grew while it was read
  return text;
}

Json read_json_file(const std::string& path) { return parse_json_text(read_json_text(path), path); }

std::string json_value_text(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

ObjectReader::ObjectReader(const Json& value, std::string file, std::string pointer,
                           ProblemList& problems)
    : value_(&value),
      file_(std::move(file)),
      pointer_(std::move(pointer)),
      problems_(&problems),
      is_object_(value.is_object()) {
  if (!is_object_) {
    problems_->add(file_, pointer_.empty() ? "/" : pointer_, json_value_text(value),
                   fmt::format("is {}, expected an object", type_name(value)));
  }
}

std::string ObjectReader::pointer_of(const std::string& key) const {
  return pointer_ + "/" + json_pointer_token(key);
}

bool ObjectReader::has(const std::string& key) const { return is_object_ && value_->contains(key); }

void ObjectReader::report(const std::string& key, const std::string& value,
                          const std::string& rule) {
  problems_->add(file_, pointer_of(key), value, rule);
}

void ObjectReader::allow(const std::string& key) { known_keys_.push_back(key); }

const Json* ObjectReader::find(const std::string& key, Need need) {
  known_keys_.push_back(key);
  if (!is_object_) return nullptr;
  auto it = value_->find(key);
  if (it == value_->end()) {
    if (need == Need::kRequired) report(key, "", "is required but missing");
    return nullptr;
  }
  return &*it;
}

std::optional<int64_t> ObjectReader::integer(const std::string& key, Need need, IntRange range) {
  const Json* field = find(key, need);
  if (field == nullptr) return std::nullopt;
  int64_t number = 0;
  if (field->is_number_unsigned()) {
    const uint64_t unsigned_value = field->get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      report(key, json_value_text(*field), "is too large");
      return std::nullopt;
    }
    number = static_cast<int64_t>(unsigned_value);
  } else if (field->is_number_integer()) {
    number = field->get<int64_t>();
  } else if (field->is_number_float() && std::isfinite(field->get<double>()) &&
             std::floor(field->get<double>()) == field->get<double>()) {
    // 1e3 is a fine integer; beyond 2^53 a double no longer holds every integer exactly.
    if (std::fabs(field->get<double>()) >= 9.0e15) {
      report(key, json_value_text(*field),
             field->get<double>() > 0 ? "is too large" : "is too small");
      return std::nullopt;
    }
    number = static_cast<int64_t>(field->get<double>());
  } else {
    report(key, json_value_text(*field),
           fmt::format("is {}, expected an integer", type_name(*field)));
    return std::nullopt;
  }
  if (number < range.min) {
    report(key, std::to_string(number), fmt::format("must be at least {}", range.min));
    return std::nullopt;
  }
  if (number > range.max) {
    report(key, std::to_string(number), fmt::format("must be at most {}", range.max));
    return std::nullopt;
  }
  return number;
}

std::optional<double> ObjectReader::real(const std::string& key, Need need, RealRange range) {
  const Json* field = find(key, need);
  if (field == nullptr) return std::nullopt;
  if (!field->is_number()) {
    report(key, json_value_text(*field),
           fmt::format("is {}, expected a number", type_name(*field)));
    return std::nullopt;
  }
  const double number = field->get<double>();
  if (!std::isfinite(number)) {
    report(key, json_value_text(*field), "must be a finite number");
    return std::nullopt;
  }
  const bool below = range.min_exclusive ? number <= range.min : number < range.min;
  if (below) {
    report(
        key, json_value_text(*field),
        fmt::format("must be {} {}", range.min_exclusive ? "greater than" : "at least", range.min));
    return std::nullopt;
  }
  if (number > range.max) {
    report(key, json_value_text(*field), fmt::format("must be at most {}", range.max));
    return std::nullopt;
  }
  return number;
}

std::optional<bool> ObjectReader::boolean(const std::string& key, Need need) {
  const Json* field = find(key, need);
  if (field == nullptr) return std::nullopt;
  if (!field->is_boolean()) {
    report(key, json_value_text(*field),
           fmt::format("is {}, expected true or false", type_name(*field)));
    return std::nullopt;
  }
  return field->get<bool>();
}

std::optional<std::string> ObjectReader::string(const std::string& key, Need need,
                                                const std::vector<std::string>& allowed) {
  const Json* field = find(key, need);
  if (field == nullptr) return std::nullopt;
  if (!field->is_string()) {
    report(key, json_value_text(*field),
           fmt::format("is {}, expected a string", type_name(*field)));
    return std::nullopt;
  }
  std::string text = field->get<std::string>();
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
    std::string choices;
    for (const std::string& choice : allowed) choices += (choices.empty() ? "" : ", ") + choice;
    report(key, json_value_text(*field),
           fmt::format("is not one of {}{}", choices, did_you_mean(text, allowed)));
    return std::nullopt;
  }
  return text;
}

std::optional<ObjectReader> ObjectReader::object(const std::string& key, Need need) {
  const Json* field = find(key, need);
  if (field == nullptr) return std::nullopt;
  if (!field->is_object()) {
    report(key, json_value_text(*field),
           fmt::format("is {}, expected an object", type_name(*field)));
    return std::nullopt;
  }
  return ObjectReader(*field, file_, pointer_of(key), *problems_);
}

const Json* ObjectReader::raw(const std::string& key, Need need) { return find(key, need); }

void ObjectReader::finish() {
  if (!is_object_) return;
  for (const auto& [key, value] : value_->items()) {
    if (std::find(known_keys_.begin(), known_keys_.end(), key) != known_keys_.end()) continue;
    report(key, "", "unknown key" + did_you_mean(key, known_keys_));
  }
}

void check_schema_version(ObjectReader& root, int supported_major) {
  const std::optional<std::string> version = root.string("schema_version", Need::kRequired);
  if (!version) return;
  // from_chars, not sscanf: an out-of-range component must not wrap to another number.
  std::optional<int> parts[3];
  size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t dot = i < 2 ? version->find('.', start) : version->size();
    if (dot == std::string::npos) break;
    parts[i] = version_component(std::string_view(*version).substr(start, dot - start));
    if (!parts[i]) break;
    start = dot + 1;
  }
  if (!parts[0] || !parts[1] || !parts[2]) {
    root.report("schema_version", json_value_text(Json(*version)),
                "must have the form major.minor.patch (e.g. \"1.0.0\")");
    return;
  }
  const int major = *parts[0];
  if (major != supported_major) {
    throw Error(ErrorCode::kSchemaVersion,
                fmt::format("{}: {}: \"{}\" has major version {}, this dhelix reads "
                            "major version {} only",
                            root.file(), root.pointer_of("schema_version"), *version, major,
                            supported_major));
  }
}

}  // namespace dhelix
