#pragma once
// Whether a profile describes the hardware a job runs on. A profile's times are those of
// one cluster (measured there, or modelled from its description); planning a job for an A40
// cluster with times measured on H100s would predict the wrong plan with full confidence.
// Its op signatures may well match (they depend on the model and parallel settings, not on
// the hardware), so coverage alone does not catch the mistake.

#include <string>

#include "lib/job_spec.h"
#include "lib/json_difference.h"
#include "lib/profile.h"

namespace dhelix {

/// Throws Error(kInvalidInput) when the profile was made for other hardware than
/// `job.cluster`: every figure of the cluster description (GPU, links, NCCL settings) must be
/// equal; names and "source" texts may differ. The message names `profile_file`, the first
/// differing field as a JSON pointer into the profile (/cluster/gpu/memory_bytes), the
/// profile's value and the job cluster's value there, and both clusters.
void check_profile_cluster(const Profile& profile, const std::string& profile_file,
                           const JobSpec& job);

}  // namespace dhelix
