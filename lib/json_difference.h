#pragma once
// Where two JSON documents first differ, named as a JSON pointer (RFC 6901), for messages
// that refuse one file against another: a profile made for another cluster
// (lib/profile_match.h), a trace measured for another plan (lib/plan_identity.h). Naming
// the field beats printing both documents: two cluster descriptions of the same name may
// differ in one link's latency.

#include <optional>
#include <string>

#include "lib/json_reader.h"

namespace dhelix {

/// A key as one JSON pointer token: '~' and '/' escaped as "~0" and "~1" (RFC 6901).
std::string json_pointer_token(const std::string& key);

/// Where two JSON values first differ: a JSON pointer and each side's value as text
/// ("(absent)" for a key or element one side lacks).
struct JsonDifference {
  std::string pointer;
  std::string first;
  std::string second;
};

/// The first difference of `a` and `b` in document order (object keys sorted, array
/// elements by index), pointers starting with `pointer`; nullopt when equal (numbers compare
/// by value: 2 == 2.0).
std::optional<JsonDifference> first_json_difference(const Json& a, const Json& b,
                                                    const std::string& pointer = "");

/// "/parallel/seq_length: 256 vs 64" ("/" for the whole document).
std::string json_difference_text(const JsonDifference& difference);

}  // namespace dhelix
