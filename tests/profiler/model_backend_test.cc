#include "profiler/model_backend.h"

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "lib/cluster_reader.h"
#include "lib/dag_builder.h"
#include "lib/job_reader.h"
#include "profiler/interference.h"

namespace dhelix {
namespace {

JobSpec example_job(const std::string& name) {
  return read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/" + name);
}

std::vector<Op> all_layer_ops(const JobSpec& job, int64_t rank) {
  std::vector<Op> ops;
  const LayerDags dags = build_layer_dags(job, rank);
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) ops.push_back(dag->op(i));
  }
  return ops;
}

TEST(ModelBackend, ProfileCoversEveryOpAndPairOfTheJob) {
  const JobSpec job = example_job("llama-25b-a40-dp8-tp8.json");
  const ProfileSpace space = collect_profile_space(job);
  const Profile profile = make_model_profile(job, {{"tool", "test"}});
  EXPECT_EQ(profile.ops().size(), space.ops.size());
  EXPECT_EQ(profile.pairs().size(), space.pairs.size());
  EXPECT_TRUE(profile.missing_signatures(all_layer_ops(job, 0)).empty());
  EXPECT_EQ(profile.model_name, job.model.name);
  EXPECT_EQ(profile.parallel["tp"], 8);
  // Every compute x comm pair and every comm x comm pair is there; no compute x compute.
  int64_t compute = 0, comm = 0;
  for (const Op& op : space.ops) (is_communication(op.kind) ? comm : compute) += 1;
  EXPECT_GT(compute, 0);
  EXPECT_GT(comm, 0);
  EXPECT_EQ(static_cast<int64_t>(space.pairs.size()), compute * comm + comm * (comm + 1) / 2);
  for (const Op& a : space.ops) {
    for (const Op& b : space.ops) {
      const bool expected = is_communication(a.kind) || is_communication(b.kind);
      EXPECT_EQ(profile.find_pair(a.signature(), b.signature()).has_value(), expected)
          << a.signature() << " x " << b.signature();
    }
  }
}

TEST(ModelBackend, TimesMatchTheCostModel) {
  const JobSpec job = example_job("llama-25b-a40-dp8-tp8.json");
  const ProfileSpace space = collect_profile_space(job);
  const Profile profile = make_model_profile(job, OrderedJson::object());
  for (const Op& op : space.ops) {
    const ProfiledOp* timed = profile.find_op(op.signature());
    ASSERT_NE(timed, nullptr);
    // Kept at the file's precision, so that planning from memory and from the file agree.
    EXPECT_DOUBLE_EQ(timed->time_us.median_us, quantize_profile_value(op_time_us(job.cluster, op)));
    EXPECT_NEAR(timed->time_us.median_us, op_time_us(job.cluster, op), 0.5e-4);
    EXPECT_GT(timed->time_us.median_us, 0) << op.signature();
    EXPECT_EQ(timed->stream, op.stream);
  }
  const auto [i, j] = space.pairs.front();
  const CoRun run =
      co_run(job.cluster, space.ops[static_cast<size_t>(i)], space.ops[static_cast<size_t>(j)]);
  const auto pair = profile.find_pair(space.ops[static_cast<size_t>(i)].signature(),
                                      space.ops[static_cast<size_t>(j)].signature());
  ASSERT_TRUE(pair);
  EXPECT_NEAR(pair->makespan_us, run.makespan_us, 1e-3);
  EXPECT_DOUBLE_EQ(pair->makespan_us, quantize_profile_value(pair->makespan_us));
}

class ModelBackendOnPresets : public testing::TestWithParam<const char*> {};

TEST_P(ModelBackendOnPresets, OefOfEveryPairOfRealJobsIsWithinMinusOneAndOne) {
  for (const char* name : {"llama-25b-a40-dp8-tp8.json", "phi-31b-a40-dp16-ep8-pp4.json",
                           "llama-39b-a40-dp2-tp8-cp2-pp2-seq16k.json"}) {
    JobSpec job = example_job(name);
    job.cluster = cluster_preset(GetParam());
    const Profile profile = make_model_profile(job, OrderedJson::object());
    ASSERT_FALSE(profile.pairs().empty()) << name;
    for (const ProfiledPair& pair : profile.pairs()) {
      EXPECT_GE(pair.oef, -1.0) << name << ": " << pair.a << " x " << pair.b;
      EXPECT_LE(pair.oef, 1.0) << name << ": " << pair.a << " x " << pair.b;
      EXPECT_GE(pair.makespan_us, std::max(profile.find_op(pair.a)->time_us.median_us,
                                           profile.find_op(pair.b)->time_us.median_us) -
                                      1e-9);
    }
    // It survives its own writer and strict reader.
    const Profile back = profile_from_json(Json::parse(profile_to_text(profile)), name);
    EXPECT_EQ(back.pairs().size(), profile.pairs().size());
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelBackendOnPresets, testing::Values("a40", "a800", "h100"));

TEST(ModelBackend, ProgressReportsEveryStep) {
  const JobSpec job = example_job("llama-25b-a40-dp8-tp8.json");
  int64_t calls = 0, last_done = 0, last_total = 0;
  make_model_profile(job, OrderedJson::object(), [&](int64_t done, int64_t total) {
    ++calls;
    last_done = done;
    last_total = total;
  });
  const ProfileSpace space = collect_profile_space(job);
  EXPECT_EQ(calls, static_cast<int64_t>(space.ops.size() + space.pairs.size()));
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, calls);
}

TEST(ModelBackend, ListNamesOpsThenPairs) {
  const JobSpec job = example_job("llama-25b-a40-dp8-tp8.json");
  const ProfileSpace space = collect_profile_space(job);
  const std::vector<std::string> lines = list_profile_space(job);
  ASSERT_EQ(lines.size(), space.ops.size() + space.pairs.size());
  EXPECT_EQ(lines.front(), "op " + std::string(stream_class_name(space.ops[0].stream)) + " " +
                               space.ops[0].signature() + " (" + space.ops[0].id + ")");
  EXPECT_EQ(lines.back().substr(0, 5), "pair ");
}

TEST(ModelBackend, ProfileValidatesAgainstItsSchema) {
  if (std::system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3 with jsonschema not available";
  }
  const JobSpec job = example_job("phi-31b-a40-dp16-ep8-pp4.json");
  const std::string path =
      (std::filesystem::temp_directory_path() / "dhelix_model_profile_test.json").string();
  write_profile(path, make_model_profile(job, {{"tool", "test"}}));
  const std::string schema = std::string(DHELIX_SOURCE_DIR) + "/schemas/profile.schema.json";
  const std::string command =
      "/usr/bin/python3 -c 'import json,sys,jsonschema; "
      "jsonschema.Draft202012Validator(json.load(open(sys.argv[1]))).validate("
      "json.load(open(sys.argv[2])))' " +
      schema + " " + path;
  EXPECT_EQ(std::system(command.c_str()), 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

TEST(ModelBackend, ShippedExampleProfileMatchesTheModel) {
  // examples/profiles/ is regenerated with
  //   DHELIX_DETERMINISTIC=1 dhelix-profile examples/jobs/llama-25b-a40-dp8-tp8.json -o ...
  const Profile shipped = read_profile(std::string(DHELIX_SOURCE_DIR) +
                                       "/examples/profiles/llama-25b-a40-dp8-tp8.json");
  const Profile fresh = make_model_profile(example_job("llama-25b-a40-dp8-tp8.json"), {});
  ASSERT_EQ(shipped.ops().size(), fresh.ops().size());
  ASSERT_EQ(shipped.pairs().size(), fresh.pairs().size());
  for (const ProfiledOp& op : fresh.ops()) {
    const ProfiledOp* old = shipped.find_op(op.signature);
    ASSERT_NE(old, nullptr) << op.signature;
    EXPECT_NEAR(old->time_us.median_us, op.time_us.median_us, 1e-3) << op.signature;
  }
}

}  // namespace
}  // namespace dhelix
