#include "lib/job_reader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lib/job_validation.h"

namespace dhelix {
namespace {

namespace fs = std::filesystem;

const std::string kModelJson = R"({
  "schema_version": "1.0.0", "name": "tiny", "hidden_size": 256, "ffn_hidden_size": 1024,
  "num_layers": 8, "num_attention_heads": 8, "num_kv_heads": 4, "vocab_size": 1000,
  "max_seq_length": 4096
})";

// A scratch folder holding models/tiny.json and the job files a test writes.
class JobReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dhelix_job_reader_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "models");
    fs::create_directories(dir_ / "jobs");
    write("models/tiny.json", kModelJson);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // A job file whose "parallel" object is `parallel` and whose extra top-level keys are `extra`.
  std::string write_job(const std::string& parallel, const std::string& extra = "") {
    return write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t", )" + extra +
                                      R"("model": "../models/tiny.json", "cluster": "a40", )"
                                      R"("parallel": )" +
                                      parallel + "}");
  }

  std::string error_of(const std::string& path, ErrorCode expected_code) {
    try {
      read_job_file(path);
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), expected_code);
      return error.what();
    }
    ADD_FAILURE() << "expected an error";
    return "";
  }

  fs::path dir_;
};

TEST_F(JobReaderTest, ReadsAJobWithARelativeModelAndAPreset) {
  const std::string path = write_job(
      R"({"dp": 2, "tp": 4, "sp": true, "cp": 1, "pp": 2, "ep": 1, "micro_batch_size": 2,
          "global_batch_size": 64, "seq_length": 2048, "rank_order": "tp-cp-ep-dp-pp"})",
      R"("description": "a test", )");
  const JobSpec job = read_job_file(path);
  EXPECT_EQ(job.name, "t");
  EXPECT_EQ(job.source_file, path);
  EXPECT_EQ(job.model.name, "tiny");
  EXPECT_EQ(job.model.source_file, (dir_ / "models/tiny.json").string());
  EXPECT_EQ(job.cluster.name, "a40");
  EXPECT_EQ(job.parallel.dp, 2);
  EXPECT_EQ(job.parallel.tp, 4);
  EXPECT_TRUE(job.parallel.sp);
  EXPECT_EQ(job.parallel.pp, 2);
  EXPECT_EQ(job.parallel.micro_batch_size, 2);
  EXPECT_EQ(job.parallel.global_batch_size, 64);
  EXPECT_EQ(job.parallel.seq_length, 2048);
  EXPECT_EQ(job.parallel.world_size(), 16);
  EXPECT_EQ(job.num_nodes(), 2);
  EXPECT_TRUE(validate_job(job).empty());
}

TEST_F(JobReaderTest, DefaultsLeaveEveryDimensionAtOne) {
  const JobSpec job = read_job_file(write_job(R"({"global_batch_size": 8, "seq_length": 512})"));
  EXPECT_EQ(job.parallel.world_size(), 1);
  EXPECT_EQ(job.parallel.ep, 1);
  EXPECT_FALSE(job.parallel.sp);
  EXPECT_EQ(job.parallel.micro_batch_size, 1);
  EXPECT_EQ(rank_order_text(job.parallel.rank_order), "tp-cp-ep-dp-pp");
}

// Every integer setting of the parallel object (taken from schemas/job.schema.json, so a new
// one is covered) is refused past its schema maximum where it is read: 2^62 layers or
// micro-batches used to reach an allocation (std::bad_alloc, exit 70).
TEST_F(JobReaderTest, EveryIntegerSettingHasTheSchemasMaximum) {
  std::ifstream in(std::string(DHELIX_SOURCE_DIR) + "/schemas/job.schema.json");
  const Json schema = Json::parse(in);
  int64_t tried = 0;
  for (const auto& [key, property] : schema["properties"]["parallel"]["properties"].items()) {
    if (property.value("type", "") != "integer") continue;
    ASSERT_TRUE(property.contains("maximum")) << key << " has no maximum in the schema";
    const int64_t maximum = property["maximum"].get<int64_t>();
    for (const std::string& value : {std::to_string(int64_t{1} << 62), std::to_string(maximum + 1),
                                     std::string("18446744073709551616")}) {
      Json parallel = {{"global_batch_size", 8}, {"seq_length", 64}};
      parallel[key] = Json::parse(value);
      const std::string message = error_of(write_job(parallel.dump()), ErrorCode::kInvalidInput);
      EXPECT_NE(message.find("job.json: /parallel/" + key + ": "), std::string::npos)
          << key << " = " << value << ": " << message;
      if (value != "18446744073709551616") {
        EXPECT_NE(message.find(value + " must be at most " + std::to_string(maximum)),
                  std::string::npos)
            << key << " = " << value << ": " << message;
      }
      ++tried;
    }
    Json at_maximum = {{"global_batch_size", 8}, {"seq_length", 64}};
    at_maximum[key] = maximum;
    try {
      read_job_file(write_job(at_maximum.dump()));  // the reader's bound is the schema's
    } catch (const Error& e) {
      ADD_FAILURE() << key << " = " << maximum << " refused by the reader: " << e.what();
    }
  }
  EXPECT_GE(tried, 36);  // 12 settings x 3 values
}

TEST_F(JobReaderTest, UnknownKeysAreReportedWithASuggestion) {
  const std::string path =
      write_job(R"({"global_batchsize": 8, "seq_length": 512})", R"("descripton": "x", )");
  EXPECT_EQ(
      error_of(path, ErrorCode::kInvalidInput),
      path + ": /parallel/global_batch_size: is required but missing\n" + path +
          ": /parallel/global_batchsize: unknown key (did you mean \"global_batch_size\"?)\n" +
          path + ": /descripton: unknown key (did you mean \"description\"?)");
}

TEST_F(JobReaderTest, BadValuesAreAllReported) {
  const std::string path = write_job(
      R"({"tp": 0, "sp": "yes", "global_batch_size": 8, "seq_length": 512,
          "rank_order": "tp-cp-ep-dp"})");
  EXPECT_EQ(error_of(path, ErrorCode::kInvalidInput),
            path + ": /parallel/tp: 0 must be at least 1\n" + path +
                ": /parallel/sp: \"yes\" is string, expected true or false\n" + path +
                ": /parallel/rank_order: \"tp-cp-ep-dp\" must name each of tp, cp, ep, dp, pp "
                "once, joined by '-' (e.g. \"tp-cp-ep-dp-pp\")");
}

TEST_F(JobReaderTest, AnotherMajorSchemaVersionIsRefused) {
  const std::string path = write("jobs/v2.json", R"({"schema_version": "2.0.0", "name": "t"})");
  EXPECT_EQ(error_of(path, ErrorCode::kSchemaVersion),
            path +
                ": /schema_version: \"2.0.0\" has major version 2, this dhelix reads major "
                "version 1 only");
}

TEST_F(JobReaderTest, MissingJobFileIsAnIoError) {
  const std::string path = (dir_ / "jobs/none.json").string();
  EXPECT_EQ(error_of(path, ErrorCode::kIo), path + ": cannot open file for reading");
}

TEST_F(JobReaderTest, MissingModelFileIsAnIoErrorNamingIt) {
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": "../models/none.json", "cluster": "a40",
      "parallel": {"global_batch_size": 8, "seq_length": 512}})");
  EXPECT_EQ(error_of(path, ErrorCode::kIo),
            (dir_ / "models/none.json").string() + ": cannot open file for reading");
}

TEST_F(JobReaderTest, UnknownPresetSuggestsOne) {
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": "../models/tiny.json", "cluster": "h10",
      "parallel": {"global_batch_size": 8, "seq_length": 512}})");
  EXPECT_EQ(error_of(path, ErrorCode::kInvalidInput),
            path +
                ": /cluster: \"h10\" is neither a cluster preset (a40, a800, h100, h200) nor "
                "a cluster file (did you mean \"h100\"?)");
}

TEST_F(JobReaderTest, InlineModelAndClusterObjects) {
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": )" + kModelJson + R"(,
      "cluster": {"schema_version": "1.0.0", "name": "two-h100", "base": "h100", "num_nodes": 2},
      "parallel": {"dp": 4, "tp": 4, "global_batch_size": 8, "seq_length": 512}})");
  const JobSpec job = read_job_file(path);
  EXPECT_EQ(job.model.name, "tiny");
  EXPECT_EQ(job.model.num_kv_heads, 4);
  EXPECT_EQ(job.model.source_file, path);  // the bytes came from the job file
  EXPECT_EQ(job.cluster.name, "two-h100");
  EXPECT_EQ(job.cluster.num_nodes, 2);
  EXPECT_EQ(job.cluster.gpus_per_node, 8);
  EXPECT_EQ(job.num_nodes(), 2);
}

TEST_F(JobReaderTest, ProblemsOfInlineObjectsCarryTheirPointerInTheJob) {
  Json model = Json::parse(kModelJson);
  model["num_attention_heads"] = 7;
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": )" + model.dump() + R"(,
      "cluster": {"schema_version": "1.0.0", "name": "bare"},
      "parallel": {"global_batch_size": 8, "seq_length": 512}})");
  // Once named the file "job.json#/cluster" with pointers relative to the inline object.
  EXPECT_EQ(error_of(path, ErrorCode::kInvalidInput),
            path + ": /model/hidden_size: 256 is not divisible by num_attention_heads = 7\n" +
                path + ": /model/num_kv_heads: 4 does not divide num_attention_heads = 7\n" + path +
                ": /cluster/gpu: is required but missing\n" + path +
                ": /cluster/intra_node: is required but missing\n" + path +
                ": /cluster/inter_node: is required but missing");
}

TEST_F(JobReaderTest, ModelAndClusterMayComeFromFlags) {
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": "../models/none.json",
      "parallel": {"global_batch_size": 8, "seq_length": 512}})");
  // The flags replace what the file gives, so its missing model file is not read.
  const JobSpec job = read_job_file(path, {.model = true, .cluster = true});
  EXPECT_EQ(job.name, "t");
  EXPECT_EQ(job.parallel.global_batch_size, 8);
  const std::string bare = write("jobs/bare.json", R"({"schema_version": "1.0.0", "name": "t",
      "parallel": {"global_batch_size": 8, "seq_length": 512}})");
  EXPECT_EQ(read_job_file(bare, {.model = true, .cluster = true}).parallel.seq_length, 512);
  EXPECT_EQ(error_of(bare, ErrorCode::kInvalidInput),
            bare + ": /model: is required but missing (give it in the file or with --model)\n" +
                bare +
                ": /cluster: is required but missing (give it in the file or with --cluster)");
}

TEST_F(JobReaderTest, ClusterFileRelativeToTheJob) {
  fs::create_directories(dir_ / "clusters");
  write("clusters/small.json",
        R"({"schema_version": "1.0.0", "name": "small-a800", "base": "a800", "num_nodes": 1})");
  const std::string path = write("jobs/job.json", R"({"schema_version": "1.0.0", "name": "t",
      "model": "../models/tiny.json", "cluster": "../clusters/small.json",
      "parallel": {"dp": 4, "tp": 4, "global_batch_size": 8, "seq_length": 512}})");
  const JobSpec job = read_job_file(path);
  EXPECT_EQ(job.cluster.name, "small-a800");
  EXPECT_EQ(job.cluster.source_file, (dir_ / "clusters/small.json").string());
  // 16 GPUs do not fit one 8-GPU node.
  const ProblemList problems = validate_job(job);
  ASSERT_EQ(problems.problems().size(), 1u);
  EXPECT_EQ(problems.problems()[0].to_string(),
            path +
                ": /parallel: world size dp·tp·cp·pp = 4·4·1·1 = 16 is more than cluster "
                "small-a800 has (1 node × 8 GPUs = 8)");
}

TEST(RankOrder, ParsesEachDimensionOnce) {
  std::string why;
  const auto order = parse_rank_order("pp-dp-ep-cp-tp", why);
  ASSERT_TRUE(order.has_value());
  EXPECT_EQ(*order, (std::vector<ParallelDim>{ParallelDim::kPp, ParallelDim::kDp, ParallelDim::kEp,
                                              ParallelDim::kCp, ParallelDim::kTp}));
  EXPECT_FALSE(parse_rank_order("tp-tp-ep-dp-pp", why).has_value());
  EXPECT_EQ(why, "names \"tp\" twice; each of tp, cp, ep, dp, pp must appear once");
  EXPECT_FALSE(parse_rank_order("tensor-cp-ep-dp-pp", why).has_value());
  EXPECT_EQ(why, "has \"tensor\", which is not one of tp, cp, ep, dp, pp");
  EXPECT_FALSE(parse_rank_order("tp-cp-ep-dp-pp-", why).has_value());
  EXPECT_EQ(why,
            "must name each of tp, cp, ep, dp, pp once, joined by '-' (e.g. \"tp-cp-ep-dp-pp\")");
}

// Every shipped job example reads and passes validation.
TEST(JobExamples, EveryExampleIsValid) {
  const fs::path jobs = fs::path(DHELIX_SOURCE_DIR) / "examples" / "jobs";
  int count = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(jobs)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    SCOPED_TRACE(entry.path().string());
    try {
      const JobSpec job = read_job_file(entry.path().string());
      const ProblemList problems = validate_job(job);
      for (const Problem& problem : problems.problems()) ADD_FAILURE() << problem.to_string();
      EXPECT_EQ(job.name, entry.path().stem().string());
    } catch (const Error& error) {
      ADD_FAILURE() << error.what();
    }
  }
  EXPECT_EQ(count, 33);  // update when adding an example
}

// ----- activation recompute and uneven pipeline stages -----

TEST_F(JobReaderTest, ReadsRecomputeAndUnevenStages) {
  const JobSpec job = read_job_file(write_job(
      R"({"pp": 2, "global_batch_size": 8, "seq_length": 512, "recompute_granularity": "full",
          "recompute_method": "block", "recompute_num_layers": 2,
          "decoder_first_pipeline_num_layers": 6})"));
  EXPECT_EQ(job.parallel.recompute.granularity, RecomputeGranularity::kFull);
  EXPECT_EQ(job.parallel.recompute.method, RecomputeMethod::kBlock);
  EXPECT_EQ(job.parallel.recompute.num_layers, 2);
  EXPECT_EQ(job.parallel.first_stage_layers, 6);
  EXPECT_EQ(job.parallel.last_stage_layers, 0);
  EXPECT_TRUE(job.parallel.uneven_stages());
  // 8 layers, pp 2, F = 6: the last stage holds b = 2 (c = 1), stage 0's chunks 5 and 1.
  EXPECT_TRUE(validate_job(job).empty());
  const OrderedJson json = parallel_to_json(job.parallel);
  EXPECT_EQ(json["recompute_granularity"], "full");
  EXPECT_EQ(json["recompute_method"], "block");
  EXPECT_EQ(json["decoder_first_pipeline_num_layers"], 6);
  EXPECT_FALSE(json.contains("decoder_last_pipeline_num_layers"));
}

// Jobs without the new fields write exactly the fields they always did.
TEST_F(JobReaderTest, DefaultsWriteNoRecomputeOrStageFields) {
  const JobSpec job = read_job_file(write_job(R"({"global_batch_size": 8, "seq_length": 512})"));
  EXPECT_FALSE(job.parallel.recompute.enabled());
  const OrderedJson json = parallel_to_json(job.parallel);
  EXPECT_FALSE(json.contains("recompute_granularity"));
  EXPECT_FALSE(json.contains("decoder_first_pipeline_num_layers"));
}

TEST_F(JobReaderTest, BadRecomputeValuesNameTheField) {
  const std::string path = write_job(
      R"({"global_batch_size": 8, "seq_length": 512, "recompute_granularity": "partial",
          "recompute_num_layers": 0})");
  const std::string message = error_of(path, ErrorCode::kInvalidInput);
  EXPECT_NE(message.find(path + ": /parallel/recompute_granularity: \"partial\""),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(path + ": /parallel/recompute_num_layers: 0"), std::string::npos)
      << message;
}

// "block_sync": "host" models a host-synchronised runtime (planner/block_launch.h); the
// default, event, writes nothing.
TEST_F(JobReaderTest, BlockSyncReadsAndWritesBack) {
  const JobSpec host = read_job_file(
      write_job(R"({"global_batch_size": 8, "seq_length": 512, "block_sync": "host"})"));
  EXPECT_TRUE(host.parallel.host_synchronized_blocks);
  EXPECT_EQ(parallel_to_json(host.parallel)["block_sync"], "host");
  const JobSpec event = read_job_file(
      write_job(R"({"global_batch_size": 8, "seq_length": 512, "block_sync": "event"})"));
  EXPECT_FALSE(event.parallel.host_synchronized_blocks);
  EXPECT_FALSE(parallel_to_json(event.parallel).contains("block_sync"));
  const std::string path =
      write_job(R"({"global_batch_size": 8, "seq_length": 512, "block_sync": "python"})");
  const std::string message = error_of(path, ErrorCode::kInvalidInput);
  EXPECT_NE(message.find(path + ": /parallel/block_sync: \"python\""), std::string::npos)
      << message;
}

}  // namespace
}  // namespace dhelix
