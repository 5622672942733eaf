#include "lib/profile_match.h"

#include <fmt/format.h>

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

}  // namespace

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
