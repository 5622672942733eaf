#include "lib/json_difference.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace dhelix {
namespace {

std::string value_text(const Json* value) {
  return value == nullptr ? std::string("(absent)") : json_value_text(*value);
}

}  // namespace

std::string json_pointer_token(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<JsonDifference> first_json_difference(const Json& a, const Json& b,
                                                    const std::string& pointer) {
  if (a == b) return std::nullopt;
  if (a.is_object() && b.is_object()) {
    // Sorted keys of both (Json objects iterate in key order): the first in that order.
    std::set<std::string> keys;
    for (const auto& [key, value] : a.items()) keys.insert(key);
    for (const auto& [key, value] : b.items()) keys.insert(key);
    for (const std::string& key : keys) {
      const std::string at = pointer + "/" + json_pointer_token(key);
      const Json* in_a = a.contains(key) ? &a.at(key) : nullptr;
      const Json* in_b = b.contains(key) ? &b.at(key) : nullptr;
      if (in_a == nullptr || in_b == nullptr) {
        return JsonDifference{at, value_text(in_a), value_text(in_b)};
      }
      if (auto found = first_json_difference(*in_a, *in_b, at)) return found;
    }
  } else if (a.is_array() && b.is_array()) {
    const size_t common = std::min(a.size(), b.size());
    for (size_t i = 0; i < common; ++i) {
      if (auto found = first_json_difference(a[i], b[i], fmt::format("{}/{}", pointer, i))) {
        return found;
      }
    }
    const std::string at = fmt::format("{}/{}", pointer, common);
    return JsonDifference{at, value_text(common < a.size() ? &a[common] : nullptr),
                          value_text(common < b.size() ? &b[common] : nullptr)};
  }
  return JsonDifference{pointer, json_value_text(a), json_value_text(b)};
}

std::string json_difference_text(const JsonDifference& difference) {
  return fmt::format("{}: {} vs {}", difference.pointer.empty() ? "/" : difference.pointer,
                     difference.first, difference.second);
}

}  // namespace dhelix
