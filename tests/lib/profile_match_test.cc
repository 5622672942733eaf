#include "lib/profile_match.h"

#include <gtest/gtest.h>

#include "lib/cluster_reader.h"
#include "lib/error.h"

namespace dhelix {
namespace {

JobSpec job_on(const std::string& preset) {
  JobSpec job;
  job.cluster = cluster_preset(preset);
  return job;
}

Profile profile_on(const ClusterSpec& cluster) {
  Profile profile;
  profile.cluster = cluster_to_json(cluster);
  return profile;
}

TEST(ProfileMatch, SameClusterPasses) {
  EXPECT_NO_THROW(
      check_profile_cluster(profile_on(cluster_preset("a40")), "p.json", job_on("a40")));
}

TEST(ProfileMatch, NamesAndCitationsMayDiffer) {
  ClusterSpec renamed = cluster_preset("a40");
  renamed.name = "our-a40s";
  renamed.gpu.source = "measured in our lab";
  renamed.intra_node.source = "";
  EXPECT_NO_THROW(check_profile_cluster(profile_on(renamed), "p.json", job_on("a40")));
}

TEST(ProfileMatch, OtherHardwareIsRefused) {
  try {
    check_profile_cluster(profile_on(cluster_preset("h100")), "p.json", job_on("a40"));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(),
                 "p.json: /cluster/gpu/attention_efficiency: the profile was made for cluster "
                 "h100 (GPU H100-SXM) with 0.32 there, but the job runs on a40 (GPU A40) with "
                 "0.5: its times describe other hardware; profile the job's cluster "
                 "(dhelix-profile JOB) or plan the job for the profile's cluster");
  }
}

// Two descriptions that look the same by name and GPU: the message names the one figure
// that differs, with both values (it once printed the two identical names only).
TEST(ProfileMatch, OneChangedFigureIsNamed) {
  ClusterSpec faster = cluster_preset("a40");
  faster.inter_node.bandwidth_gbps *= 2;
  try {
    check_profile_cluster(profile_on(faster), "p.json", job_on("a40"));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("p.json: /cluster/inter_node/bandwidth_gbps: the profile was made for "
                           "cluster a40 (GPU A40) with " +
                           json_value_text(Json(faster.inter_node.bandwidth_gbps)) +
                           " there, but the job runs on a40 (GPU A40) with " +
                           json_value_text(Json(cluster_preset("a40").inter_node.bandwidth_gbps))),
              std::string::npos)
        << message;
  }
}

TEST(ProfileMatch, FirstDifferenceOfEveryFamily) {
  const Json base = Json::parse(R"({"a": 1, "b": {"c": [1, 2], "d/e": "x"}})");
  EXPECT_FALSE(first_json_difference(base, base, ""));
  // Numbers compare by value, whatever their JSON spelling.
  EXPECT_FALSE(first_json_difference(Json::parse(R"({"a": 2})"), Json::parse(R"({"a": 2.0})"), ""));
  const auto changed = [&](const char* text) {
    return first_json_difference(base, Json::parse(text), "/cluster");
  };
  auto d = changed(R"({"a": 2, "b": {"c": [1, 2], "d/e": "x"}})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/a");
  EXPECT_EQ(d->first, "1");
  EXPECT_EQ(d->second, "2");
  d = changed(R"({"a": 1, "b": {"c": [1, 3], "d/e": "x"}})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/b/c/1");
  d = changed(R"({"a": 1, "b": {"c": [1], "d/e": "x"}})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/b/c/1");
  EXPECT_EQ(d->second, "(absent)");
  d = changed(R"({"a": 1, "b": {"c": [1, 2], "d/e": "y"}})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/b/d~1e");
  d = changed(R"({"a": 1, "b": {"c": [1, 2], "d/e": "x"}, "z": true})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/z");
  EXPECT_EQ(d->first, "(absent)");
  EXPECT_EQ(d->second, "true");
  d = changed(R"({"a": "1", "b": {"c": [1, 2], "d/e": "x"}})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->pointer, "/cluster/a");
}

}  // namespace
}  // namespace dhelix
