// A planned MFU above 100 % is impossible: every op time the planner accepts is at least
// the op's work at the GPU's peak (lib/profile_bounds.h), and MFU counts no FLOPs the ops do
// not do. Checked on shipped jobs with the model profile and with the most hostile profiles
// the bounds let through: every op exactly at its bound, co-runs without any slowdown; and
// random times above the bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/profile_bounds.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"

namespace dhelix {
namespace {

JobSpec shipped_job(const std::string& name) {
  return read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/" + name + ".json");
}

// The least time the profile file can hold at or above `us` (4 decimals).
double at_or_above(double us) { return std::ceil(us * 1e4) / 1e4; }

// A profile of `job` whose solo times are the bounds times `scale(op)` (>= 1) and whose
// pairs co-run with no slowdown at all (finish = solo: the fastest co-run there is).
template <typename Scale>
Profile bounded_profile(const JobSpec& job, Scale scale) {
  const ProfileSpace space = collect_profile_space(job);
  Profile profile;
  for (const Op& op : space.ops) {
    // 1e-3 us, a timer's resolution (lib/profile_bounds.h), for ops without a FLOP or
    // bandwidth bound (elementwise, norms, memory or no work).
    const double us = std::max(1e-3, at_or_above(minimum_op_time_us(job.cluster, op) * scale(op)));
    profile.add_op(profiled_op(op, TimeStats::exactly(us), 1));
  }
  for (const auto& [i, j] : space.pairs) {
    const std::string a = space.ops[static_cast<size_t>(i)].signature();
    const std::string b = space.ops[static_cast<size_t>(j)].signature();
    const double ta = profile.find_op(a)->time_us.median_us;
    const double tb = profile.find_op(b)->time_us.median_us;
    profile.add_pair({.a = a,
                      .b = b,
                      .finish_a_us = ta,
                      .finish_b_us = tb,
                      .makespan_us = std::max(ta, tb),
                      .oef = overlap_effectiveness(ta, tb, std::max(ta, tb))});
  }
  return profile;
}

// Plans `job` on `profile` and returns the largest MFU of its schemes, or -1 when the plan
// is refused because an iteration would beat the GPUs' peak (iteration_metrics).
double largest_mfu(const JobSpec& job, const Profile& profile) {
  PlanRequest request;
  request.job = &job;
  request.profile = &profile;
  request.profile_name = "hostile.json";
  request.profile_ref = {.name = "model", .sha256 = "generated:model"};
  const ClusterSpec cluster = job.cluster;
  request.unprofiled_op_time_us = [cluster](const Op& op) { return op_time_us(cluster, op); };
  try {
    const PlanResult result = build_plan(request);
    double largest = 0;
    for (const PlanScheme& scheme : result.plan.schemes) largest = std::max(largest, scheme.mfu);
    return largest;
  } catch (const Error& error) {
    const std::string message = error.what();
    if (message.find("hostile.json: its times give an iteration of ") != 0) throw;
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(message.find("% of the peak of its "), std::string::npos) << message;
    return -1;
  }
}

// Attention-heavy (sequence 16k and 32k with CP, the A800's attention efficiency above 0.5),
// MoE, recomputation, pipeline stages, and the CPU cluster.
const char* const kJobs[] = {"llama-8b-a40-dp8-tp4-cp2-seq16k",
                             "llama-66b-a800-dp1-tp8-cp4-pp2-seq32k",
                             "llama-8b-a40-dp16-tp4",
                             "phi-31b-a40-dp16-ep8-pp4",
                             "tiny-tp2",
                             "tiny-moe-ep2-recompute",
                             "tiny-cp2-tp2"};

TEST(MfuBound, ModelProfilesStayBelowPeak) {
  for (const char* name : kJobs) {
    const JobSpec job = shipped_job(name);
    const Profile profile = make_model_profile(job, OrderedJson::object());
    const double mfu = largest_mfu(job, profile);
    EXPECT_GT(mfu, 0) << name;
    EXPECT_LE(mfu, 1.0) << name;
  }
}

// With every op at its bound (the fastest profile the per-op check accepts), the jobs with
// long sequences would plan above 100 % on Megatron's count (it includes the masked half of
// causal attention): 111 % at 16k on A40s, 120 % at 32k on A800s, 102 % at 8k. Those plans
// are refused; none reports more than 100 %.
TEST(MfuBound, EveryOpAtItsBoundStaysBelowPeak) {
  int refused = 0;
  for (const char* name : kJobs) {
    const JobSpec job = shipped_job(name);
    const Profile profile = bounded_profile(job, [](const Op&) { return 1.0; });
    const double mfu = largest_mfu(job, profile);
    EXPECT_LE(mfu, 1.0) << name;
    refused += mfu < 0 ? 1 : 0;
  }
  EXPECT_GE(refused, 2);  // the 16k and 32k jobs at least
}

TEST(MfuBound, RandomTimesAboveTheBoundsStayBelowPeak) {
  std::mt19937_64 random(37);
  std::uniform_real_distribution<double> above(1.0, 3.0);
  for (const char* name : kJobs) {
    const JobSpec job = shipped_job(name);
    for (int trial = 0; trial < 2; ++trial) {
      const Profile profile = bounded_profile(job, [&](const Op&) { return above(random); });
      EXPECT_LE(largest_mfu(job, profile), 1.0) << name << " trial " << trial;
    }
  }
}

// Just below the bound (by more than the file's rounding) is refused, naming the op.
TEST(MfuBound, BelowTheBoundIsRefused) {
  const JobSpec job = shipped_job("tiny-tp2");
  const Profile profile = bounded_profile(job, [](const Op&) { return 0.5; });
  try {
    largest_mfu(job, profile);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    // ops/0 is a norm, which has no FLOP bound; ops/2 is the first GEMM.
    EXPECT_NE(std::string(error.what()).find("hostile.json: /ops/2/time_us/median: "),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace dhelix
