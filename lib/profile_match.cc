#include "lib/profile_match.h"

#include <fmt/format.h>

#include <optional>
#include <set>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/json_reader.h"

namespace dhelix {
namespace {

// The figures of a cluster description: without its name and the "source" citations,
// which say where figures come from but are not figures.
Json figures(const OrderedJson& cluster) {
  Json out = Json::parse(cluster.dump());
  if (!out.is_object()) return out;
  out.erase("name");
  for (auto& [key, value] : out.items()) {
    if (value.is_object()) value.erase("source");
  }
  return out;
}

std::string describe(const OrderedJson& cluster) {
  const std::string name = cluster.contains("name") && cluster["name"].is_string()
                               ? cluster["name"].get<std::string>()
                               : std::string("(unnamed)");
  const bool has_gpu = cluster.contains("gpu") && cluster["gpu"].is_object() &&
                       cluster["gpu"].contains("name") && cluster["gpu"]["name"].is_string();
  return has_gpu ? fmt::format("{} (GPU {})", name, cluster["gpu"]["name"].get<std::string>())
                 : name;
}

// "~0" and "~1" escapes of RFC 6901, so that the pointer names the key exactly.
std::string pointer_token(const std::string& key) {
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

std::string value_text(const Json* value) {
  return value == nullptr ? std::string("(absent)") : json_value_text(*value);
}

}  // namespace

std::optional<JsonDifference> first_json_difference(const Json& a, const Json& b,
                                                    const std::string& pointer) {
  if (a == b) return std::nullopt;
  if (a.is_object() && b.is_object()) {
    // Sorted keys of both (Json objects iterate in key order): the first in that order.
    std::set<std::string> keys;
    for (const auto& [key, value] : a.items()) keys.insert(key);
    for (const auto& [key, value] : b.items()) keys.insert(key);
    for (const std::string& key : keys) {
      const std::string at = pointer + "/" + pointer_token(key);
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

void check_profile_cluster(const Profile& profile, const std::string& profile_file,
                           const JobSpec& job) {
  const OrderedJson expected = cluster_to_json(job.cluster);
  const std::optional<JsonDifference> difference =
      first_json_difference(figures(profile.cluster), figures(expected), "/cluster");
  if (!difference) return;
  // The first differing figure is named: two descriptions of the same name and GPU may
  // differ in one link's latency, which the names alone would hide.
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: {}: the profile was made for cluster {} with {} there, but the job "
                          "runs on {} with {}: its times describe other hardware; profile the "
                          "job's cluster (dhelix-profile JOB) or plan the job for the profile's "
                          "cluster",
                          profile_file, difference->pointer, describe(profile.cluster),
                          difference->first, describe(expected), difference->second));
}

}  // namespace dhelix
