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
                 "p.json: /cluster: the profile was made for cluster h100 (GPU H100-SXM), but the "
                 "job runs on a40 (GPU A40): its times describe other hardware; profile the "
                 "job's cluster (dhelix-profile JOB) or plan the job for the profile's cluster");
  }
}

TEST(ProfileMatch, OneChangedFigureIsRefused) {
  ClusterSpec faster = cluster_preset("a40");
  faster.inter_node.bandwidth_gbps *= 2;
  EXPECT_THROW(check_profile_cluster(profile_on(faster), "p.json", job_on("a40")), Error);
}

}  // namespace
}  // namespace dhelix
