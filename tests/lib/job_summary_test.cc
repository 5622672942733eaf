#include "lib/job_summary.h"

#include <gtest/gtest.h>

#include "lib/job_reader.h"

namespace dhelix {
namespace {

JobSpec example_job(const std::string& name) {
  return read_job_file(std::string(DHELIX_SOURCE_DIR) + "/examples/jobs/" + name + ".json");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// llama-8b on A40, dp16 tp4: 64 GPUs on 8 nodes; TP groups of 4 consecutive ranks stay in a
// node, DP groups of 16 ranks 4 apart span all 8 nodes.
TEST(JobSummary, TextNamesSizesBatchAndGroups) {
  const JobSpec job = example_job("llama-8b-a40-dp16-tp4");
  const std::string text = job_summary_text(job);
  SCOPED_TRACE(text);
  EXPECT_TRUE(contains(text, "job        llama-8b-a40-dp16-tp4 ("));
  EXPECT_TRUE(contains(text,
                       "parallel   dp 16 · tp 4 · cp 1 · pp 1 · ep 1, sp on, rank order "
                       "tp-cp-ep-dp-pp\n"));
  EXPECT_TRUE(contains(text, "world size 64 GPUs on 8 nodes of 8 A40\n"));
  EXPECT_TRUE(contains(text,
                       "batch      1024 sequences × 8192 tokens = 8388608 tokens per "
                       "iteration\n"));
  EXPECT_TRUE(contains(text, "micro-batch 1, 64 micro-batches per pipeline per iteration\n"));
  EXPECT_TRUE(contains(text, "           tp      4      16  local       0 1 2 3\n"));
  EXPECT_TRUE(contains(text,
                       "           dp     16       4  cross-node  0 4 8 12 16 20 24 28 32 "
                       "36 40 44 48 52 56 60\n"));
  EXPECT_TRUE(contains(text, "           pp      1      64  local       0\n"));
}

TEST(JobSummary, JsonHoldsTheSameFacts) {
  const JobSpec job = example_job("llama-39b-a40-dp2-tp8-cp2-pp2-seq16k");
  const OrderedJson json = job_summary_json(job);
  EXPECT_EQ(json["world_size"], 64);
  EXPECT_EQ(json["num_nodes"], 8);
  EXPECT_EQ(json["micro_batches_per_iteration"], 256);  // 512 / (1 · 2)
  EXPECT_EQ(json["tokens_per_iteration"], 512 * 16384);
  EXPECT_EQ(json["parallel"]["cp"], 2);
  EXPECT_EQ(json["parallel"]["rank_order"], "tp-cp-ep-dp-pp");
  // Default order tp-cp-ep-dp-pp: rank = tp + 8·cp + 16·dp + 32·pp.
  const OrderedJson& groups = json["groups"];
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_EQ(groups[1]["dim"], "cp");
  EXPECT_EQ(groups[1]["rank0_group"], OrderedJson({0, 8}));
  EXPECT_EQ(groups[1]["scope"], "cross-node");
  EXPECT_EQ(groups[1]["count"], 32);
  EXPECT_EQ(groups[3]["dim"], "dp");
  EXPECT_EQ(groups[3]["rank0_group"], OrderedJson({0, 16}));
  EXPECT_EQ(groups[4]["dim"], "pp");
  EXPECT_EQ(groups[4]["rank0_group"], OrderedJson({0, 32}));
  EXPECT_EQ(groups[4]["cross_node_count"], 32);
}

}  // namespace
}  // namespace dhelix
