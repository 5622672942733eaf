#include "lib/cluster_reader.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/cluster_presets.h"

namespace dhelix {
namespace {

std::string example(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/clusters/" + name + ".json";
}

std::vector<std::string> problems_of(const std::string& text) {
  ProblemList problems;
  cluster_from_json(Json::parse(text), "c.json", problems);
  std::vector<std::string> lines;
  for (const Problem& problem : problems.problems()) lines.push_back(problem.to_string());
  return lines;
}

std::string error_of(const std::string& preset_or_path) {
  try {
    read_cluster(preset_or_path);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  return "(no error)";
}

using Lines = std::vector<std::string>;

// A name longer than the file system allows is a misspelt preset, not a crash (found by
// the job fuzzer: std::filesystem::exists threw on it).
TEST(ClusterPresets, OverlongNameIsAnUnknownPreset) {
  const std::string name(5000, 'h');
  EXPECT_NE(error_of(name).find("cluster preset"), std::string::npos) << error_of(name);
}

TEST(ClusterPresets, NamesAreStable) {
  EXPECT_EQ(cluster_preset_names(), (Lines{"a40", "a800", "h100", "h200"}));
}

TEST(ClusterPresets, PaperTestbedFigures) {
  const ClusterSpec a40 = cluster_preset("a40");
  EXPECT_EQ(a40.gpu.name, "A40");
  EXPECT_DOUBLE_EQ(a40.gpu.peak_bf16_tflops, 149.7);
  EXPECT_EQ(a40.gpu.memory_bytes, int64_t{48} << 30);
  EXPECT_EQ(a40.intra_node.kind, LinkKind::kPcie);
  EXPECT_DOUBLE_EQ(a40.intra_node.bandwidth_gbps, 32.0);
  EXPECT_EQ(a40.inter_node.kind, LinkKind::kInfiniBand);
  EXPECT_DOUBLE_EQ(a40.inter_node.bandwidth_gbps, 12.5);  // 100 Gb/s
  EXPECT_EQ(a40.nics_per_node, 1);
  EXPECT_DOUBLE_EQ(a40.inter_node_bandwidth_per_gpu_gbps(), 12.0 / 8);

  const ClusterSpec a800 = cluster_preset("a800");
  EXPECT_DOUBLE_EQ(a800.intra_node.bandwidth_gbps, 200.0);
  EXPECT_DOUBLE_EQ(a800.intra_node.bus_bandwidth_gbps, 160.0);
  EXPECT_DOUBLE_EQ(a800.inter_node.bandwidth_gbps, 25.0);  // 200 Gb/s
  EXPECT_EQ(a800.nics_per_node, 4);
  EXPECT_DOUBLE_EQ(a800.inter_node_bandwidth_per_gpu_gbps(), 24.0 * 4 / 8);

  const ClusterSpec h100 = cluster_preset("h100");
  EXPECT_DOUBLE_EQ(h100.gpu.peak_bf16_tflops, 989.0);
  EXPECT_EQ(h100.gpu.sm_count, 132);
  EXPECT_DOUBLE_EQ(h100.intra_node.bandwidth_gbps, 450.0);
  EXPECT_DOUBLE_EQ(h100.inter_node.bandwidth_gbps, 50.0);  // 400 Gb/s
  EXPECT_EQ(h100.nics_per_node, 8);

  const ClusterSpec h200 = cluster_preset("h200");
  EXPECT_EQ(h200.gpu.memory_bytes, int64_t{141} << 30);
  EXPECT_DOUBLE_EQ(h200.gpu.memory_bandwidth_gbps, 4800.0);
  EXPECT_DOUBLE_EQ(h200.intra_node.bandwidth_gbps, 450.0);

  for (const std::string& name : cluster_preset_names()) {
    SCOPED_TRACE(name);
    const ClusterSpec preset = cluster_preset(name);
    EXPECT_EQ(preset.num_nodes, 0);
    EXPECT_EQ(preset.gpus_per_node, 8);
    EXPECT_FALSE(preset.gpu.source.empty());
    EXPECT_FALSE(preset.intra_node.source.empty());
    EXPECT_FALSE(preset.inter_node.source.empty());
  }
}

TEST(ClusterPresets, UnknownNameSuggestsOne) {
  EXPECT_EQ(error_of("h10"),
            "unknown cluster preset \"h10\" (did you mean \"h100\"?); presets: a40, a800, h100, "
            "h200");
  EXPECT_EQ(error_of("tpu"), "unknown cluster preset \"tpu\"; presets: a40, a800, h100, h200");
  EXPECT_FALSE(find_cluster_preset("a80").has_value());
}

TEST(ClusterReader, ExamplePresetFilesReadBackEqualToThePresets) {
  for (const std::string& name : cluster_preset_names()) {
    SCOPED_TRACE(name);
    const ClusterSpec from_file = read_cluster(example(name));
    EXPECT_EQ(from_file.source_file, example(name));
    // cluster_to_json writes every figure, so equal JSON means equal specs.
    EXPECT_EQ(cluster_to_json(from_file).dump(), cluster_to_json(cluster_preset(name)).dump());
  }
}

TEST(ClusterReader, BaseWithOneOverride) {
  const ClusterSpec custom = read_cluster(example("a800-2nic"));
  EXPECT_EQ(custom.name, "a800-2nic");
  EXPECT_EQ(custom.nics_per_node, 2);
  EXPECT_EQ(custom.nccl_sms_inter_node, 4);
  EXPECT_DOUBLE_EQ(custom.inter_node_bandwidth_per_gpu_gbps(), 6.0);
  ClusterSpec expected = cluster_preset("a800");
  expected.name = "a800-2nic";
  expected.nics_per_node = 2;
  expected.nccl_sms_inter_node = 4;
  EXPECT_EQ(cluster_to_json(custom).dump(), cluster_to_json(expected).dump());
}

TEST(ClusterReader, NestedOverrideKeepsTheRestOfTheObject) {
  ProblemList problems;
  const ClusterSpec c = cluster_from_json(Json::parse(R"({
      "schema_version": "1.0.0", "name": "h100-slow", "base": "h100",
      "gpu": {"gemm_efficiency": 0.6}, "inter_node": {"bus_bandwidth_gbps": 40}})"),
                                          "c.json", problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_DOUBLE_EQ(c.gpu.gemm_efficiency, 0.6);
  EXPECT_EQ(c.gpu.name, "H100-SXM");
  EXPECT_DOUBLE_EQ(c.gpu.peak_bf16_tflops, 989.0);
  EXPECT_DOUBLE_EQ(c.inter_node.bus_bandwidth_gbps, 40.0);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_gbps, 50.0);
}

TEST(ClusterReader, UnknownBaseSuggestsOne) {
  EXPECT_EQ(problems_of(R"({"schema_version": "1.0.0", "name": "x", "base": "a4"})"),
            Lines{"c.json: /base: \"a4\" is not one of a40, a800, h100, h200 (did you mean "
                  "\"a40\"?)"});
}

TEST(ClusterReader, UnknownKeysAreErrors) {
  EXPECT_EQ(problems_of(R"({"schema_version": "1.0.0", "name": "x", "base": "a40",
                            "nic_per_node": 2, "gpu": {"sm_cout": 80}})"),
            (Lines{"c.json: /gpu/sm_cout: unknown key (did you mean \"sm_count\"?)",
                   "c.json: /nic_per_node: unknown key (did you mean \"nics_per_node\"?)"}));
}

TEST(ClusterReader, WithoutBaseTheHardwareMustBeDescribed) {
  EXPECT_EQ(problems_of(R"({"schema_version": "1.0.0", "name": "x",
                            "gpu": {"name": "G", "peak_bf16_tflops": 100, "memory_bytes": 1000,
                                    "memory_bandwidth_gbps": 1000, "sm_count": 100},
                            "intra_node": {"kind": "nvlink", "bandwidth_gbps": 100}})"),
            (Lines{"c.json: /intra_node/bus_bandwidth_gbps: is required but missing",
                   "c.json: /inter_node: is required but missing"}));
}

TEST(ClusterReader, FiguresAreRangeChecked) {
  EXPECT_EQ(problems_of(R"({"schema_version": "1.0.0", "name": "x", "base": "a40",
                            "gpus_per_node": 0, "gpu": {"gemm_efficiency": 1.5},
                            "intra_node": {"bandwidth_gbps": 0, "kind": "pcie4"},
                            "nccl_sms_intra_node": 84})"),
            (Lines{"c.json: /gpu/gemm_efficiency: 1.5 must be at most 1",
                   "c.json: /gpus_per_node: 0 must be at least 1",
                   "c.json: /intra_node/kind: \"pcie4\" is not one of nvlink, pcie, infiniband, "
                   "ethernet (did you mean \"pcie\"?)",
                   "c.json: /intra_node/bandwidth_gbps: 0 must be greater than 0",
                   "c.json: /nccl_sms_intra_node: 84 must be less than the GPU's sm_count = 84"}));
}

TEST(ClusterReader, LinkKindNames) {
  EXPECT_STREQ(link_kind_name(LinkKind::kNvLink), "nvlink");
  EXPECT_STREQ(link_kind_name(LinkKind::kPcie), "pcie");
  EXPECT_STREQ(link_kind_name(LinkKind::kInfiniBand), "infiniband");
  EXPECT_STREQ(link_kind_name(LinkKind::kEthernet), "ethernet");
}

}  // namespace
}  // namespace dhelix
