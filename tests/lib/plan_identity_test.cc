#include "lib/plan_identity.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/json_difference.h"

namespace dhelix {
namespace {

JobSpec tiny_job() {
  return read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/tiny-tp2.json");
}

// The trace's /otherData as dhelix-run --trace writes it.
Json other_data(const PlanIdentity& identity) {
  Json other = {{"job", "tiny-tp2"}, {"measured", true}, {"schedule", "co-executed"}};
  other["plan_identity"] = Json::parse(plan_identity_json(identity).dump());
  return other;
}

TEST(PlanIdentity, SameJobSameIdentityWhateverItsNameOrFile) {
  const JobSpec a = tiny_job();
  JobSpec b = tiny_job();
  b.name = "renamed";
  b.source_file = "elsewhere.json";
  EXPECT_EQ(plan_identity(a).sha256, plan_identity(b).sha256);
  EXPECT_EQ(plan_identity(a).sha256.size(), 64U);
}

TEST(PlanIdentity, EveryOpDeterminingPartChangesIt) {
  const std::string base = plan_identity(tiny_job()).sha256;
  JobSpec seq = tiny_job();
  seq.parallel.seq_length = 256;
  JobSpec hidden = tiny_job();
  hidden.model.hidden_size *= 2;
  JobSpec cluster = tiny_job();
  cluster.cluster.gpus_per_node = 1;
  for (const JobSpec* changed : {&seq, &hidden, &cluster}) {
    EXPECT_NE(plan_identity(*changed).sha256, base);
  }
}

TEST(PlanIdentity, FirstDifferenceNamesTheField) {
  JobSpec seq = tiny_job();
  seq.parallel.seq_length = 256;
  const Json a = Json::parse(plan_identity(seq).job.dump());
  const Json b = Json::parse(plan_identity(tiny_job()).job.dump());
  const auto text = [](const Json& first, const Json& second) {
    const auto found = first_json_difference(first, second);
    return found ? json_difference_text(*found) : std::string();
  };
  EXPECT_EQ(text(a, b), "/parallel/seq_length: 256 vs 64");
  EXPECT_EQ(text(a, a), "");
  EXPECT_EQ(text(Json{{"x", 1}}, Json{{"x", 1}, {"y", 2}}), "/y: (absent) vs 2");
  EXPECT_EQ(text(Json{{"x", {1, 2}}}, Json{{"x", {1, 3}}}), "/x/1: 2 vs 3");
  EXPECT_EQ(text(Json{{"a/b~", 1}}, Json{{"a/b~", 2}}), "/a~1b~0: 1 vs 2");
  EXPECT_EQ(text(Json(1), Json(2)), "/: 1 vs 2");
}

TEST(PlanIdentity, TraceOfTheSamePlanPasses) {
  const PlanIdentity identity = plan_identity(tiny_job());
  EXPECT_EQ(check_trace_identity(other_data(identity), identity, "t.json", "the plan"),
            std::nullopt);
}

// The case: a trace of the sequence-256 plan read with the sequence-64 plan.
TEST(PlanIdentity, TraceOfAnotherPlanIsRefusedNamingBothHashesAndTheField) {
  JobSpec seq256 = tiny_job();
  seq256.parallel.seq_length = 256;
  const PlanIdentity traced = plan_identity(seq256);
  const PlanIdentity ours = plan_identity(tiny_job());
  try {
    check_trace_identity(other_data(traced), ours, "t.json", "the plan p.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    const std::string message = e.what();
    EXPECT_NE(
        message.find("t.json: /otherData/plan_identity/sha256: " + traced.sha256.substr(0, 12) +
                     " was measured with another plan than "
                     "the plan p.json (plan identity " +
                     ours.sha256.substr(0, 12) + ")"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("first difference: /parallel/seq_length: 256 vs 64"), std::string::npos)
        << message;
  }
}

TEST(PlanIdentity, TraceWithoutIdentityIsAcceptedWithAWarning) {
  Json other = other_data(plan_identity(tiny_job()));
  other.erase("plan_identity");
  const std::optional<std::string> warning =
      check_trace_identity(other, plan_identity(tiny_job()), "old.json", "the plan");
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("old.json: /otherData/plan_identity: absent"), std::string::npos);
  EXPECT_NE(warning->find("only the job's name was checked"), std::string::npos);
}

TEST(PlanIdentity, MalformedIdentityIsRefused) {
  for (const Json& bad : {Json("abc"), Json::object(), Json{{"sha256", 5}}}) {
    Json other = other_data(plan_identity(tiny_job()));
    other["plan_identity"] = bad;
    EXPECT_THROW(check_trace_identity(other, plan_identity(tiny_job()), "t.json", "the plan"),
                 Error)
        << bad.dump();
  }
}

}  // namespace
}  // namespace dhelix
