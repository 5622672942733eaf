#pragma once
// What every reader fuzz target shares. A target hands libFuzzer's bytes to one reader as
// the text of a JSON file; the reader may refuse it with a dhelix::Error (that is its job),
// and anything else (a crash, a sanitizer report, DHELIX_CHECK's abort, another exception
// type escaping) is a bug, which libFuzzer reports when the exception leaves the target.

#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/error.h"
#include "lib/json_reader.h"

namespace dhelix::fuzz {

/// Name the fuzzed bytes go by in messages (messages are built in full on every input,
/// so a bug in building them is found too).
inline constexpr const char* kFuzzFileName = "fuzz.json";

/// Parses the bytes as JSON with the readers' own parser and runs `read` on the result.
/// dhelix::Error from either step is the expected refusal and is swallowed.
template <typename Read>
int read_fuzzed_json(const uint8_t* data, size_t size, Read read) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Json json = parse_json_text(text, kFuzzFileName);
    read(json);
  } catch (const Error& error) {
    // A refusal must say something: an empty message would leave the user guessing.
    if (std::string(error.what()).empty()) __builtin_trap();
  }
  return 0;
}

}  // namespace dhelix::fuzz
