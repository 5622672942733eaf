// docs/presets.md against the code: every cell of its preset tables (GPU, links, NCCL
// interference) equals the figure of lib/cluster_presets.cc, and every row of its constants
// table equals the constant it names. A figure changed on one side only fails here, and so
// does a column the test does not know (it would go unchecked).
//
// A table is a run of lines starting with '|': the header, the separator, the rows. Tables
// whose first header cell is "preset" are preset tables, "constant" the constants table; the
// others (sources, calibration) are prose and are not checked.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lib/cluster_presets.h"
#include "lib/cluster_reader.h"
#include "lib/moe_routing.h"
#include "planner/block_launch.h"
#include "planner/memory_model.h"
#include "profiler/compute_cost.h"
#include "profiler/interference.h"

namespace dhelix {
namespace {

using Row = std::vector<std::string>;
struct Table {
  int line = 0;  // 1-based line of the header in the document
  Row header;
  std::vector<Row> rows;
};

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(' ') - first + 1);
}

Row cells_of(const std::string& line) {
  Row cells;
  std::stringstream in(line.substr(1));  // drop the leading '|'
  std::string cell;
  while (std::getline(in, cell, '|')) cells.push_back(trim(cell));
  if (!cells.empty() && cells.back().empty()) cells.pop_back();  // the trailing '|'
  return cells;
}

std::vector<Table> tables_of(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<Table> tables;
  std::string line;
  bool inside = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.rfind('|', 0) != 0) {
      inside = false;
      continue;
    }
    if (!inside) {
      tables.push_back({number, cells_of(line), {}});
      inside = true;
    } else if (line.rfind("|---", 0) != 0) {
      tables.back().rows.push_back(cells_of(line));
    }
  }
  return tables;
}

std::string presets_doc() { return std::string(DHELIX_SOURCE_DIR) + "/docs/presets.md"; }

// How a figure is written in the document: shortest form of the number.
std::string num(double value) { return fmt::format("{:g}", value); }
std::string fraction(double value) { return fmt::format("{:.2f}", value); }

using Cell = std::function<std::string(const ClusterSpec&)>;

// Every column a preset table may have, with the cell it must hold. Descriptive columns
// (the link's and NIC's names) map to nullptr: they are words, not figures.
const std::map<std::string, Cell>& preset_columns() {
  static const std::map<std::string, Cell> columns = {
      {"GPU", [](const ClusterSpec& c) { return c.gpu.name; }},
      {"dense bf16 TFLOP/s", [](const ClusterSpec& c) { return num(c.gpu.peak_bf16_tflops); }},
      {"memory",
       [](const ClusterSpec& c) { return fmt::format("{} GiB", c.gpu.memory_bytes >> 30); }},
      {"memory bw GB/s", [](const ClusterSpec& c) { return num(c.gpu.memory_bandwidth_gbps); }},
      {"SMs", [](const ClusterSpec& c) { return num(static_cast<double>(c.gpu.sm_count)); }},
      {"GEMM eff.", [](const ClusterSpec& c) { return fraction(c.gpu.gemm_efficiency); }},
      {"attention eff.", [](const ClusterSpec& c) { return fraction(c.gpu.attention_efficiency); }},
      {"memory eff.", [](const ClusterSpec& c) { return fraction(c.gpu.memory_efficiency); }},
      {"intra-node link", nullptr},
      {"intra bw GB/s", [](const ClusterSpec& c) { return num(c.intra_node.bandwidth_gbps); }},
      {"intra busbw GB/s",
       [](const ClusterSpec& c) { return num(c.intra_node.bus_bandwidth_gbps); }},
      {"intra alpha us", [](const ClusterSpec& c) { return num(c.intra_node.latency_us); }},
      {"NIC", nullptr},
      {"NIC bw GB/s", [](const ClusterSpec& c) { return num(c.inter_node.bandwidth_gbps); }},
      {"NIC busbw GB/s", [](const ClusterSpec& c) { return num(c.inter_node.bus_bandwidth_gbps); }},
      {"NIC alpha us", [](const ClusterSpec& c) { return num(c.inter_node.latency_us); }},
      {"NICs/node", [](const ClusterSpec& c) { return num(static_cast<double>(c.nics_per_node)); }},
      {"cross-node GB/s per GPU",
       [](const ClusterSpec& c) { return num(c.inter_node_bandwidth_per_gpu_gbps()); }},
      {"NCCL SMs intra-node",
       [](const ClusterSpec& c) { return num(static_cast<double>(c.nccl_sms_intra_node)); }},
      {"NCCL SMs inter-node",
       [](const ClusterSpec& c) { return num(static_cast<double>(c.nccl_sms_inter_node)); }},
      {"memory traffic factor",
       [](const ClusterSpec& c) { return num(c.nccl_memory_traffic_factor); }},
  };
  return columns;
}

// The constants table's rows: the identifier in backticks and its value as written.
std::map<std::string, std::string> constants() {
  const MemoryOptions memory;
  return {
      {"`kKernelLaunchUs`", num(kKernelLaunchUs)},
      {"`kGemmTileM`", num(static_cast<double>(kGemmTileM))},
      {"`kGemmTileN`", num(static_cast<double>(kGemmTileN))},
      {"`kGemmSizeHalfDim`", num(kGemmSizeHalfDim)},
      {"`kAttentionBackwardFactor`", num(kAttentionBackwardFactor)},
      {"`kComputeContention`", num(kComputeContention)},
      {"`kAttentionBackwardContention`", num(kAttentionBackwardContention)},
      {"`kHostBlockLaunchUs`", num(kHostBlockLaunchUs)},
      {"`kDefaultMoeLoadImbalance`", num(kDefaultMoeLoadImbalance)},
      {"`MemoryOptions::reserve_fraction`", num(memory.reserve_fraction)},
      {"`MemoryOptions::fixed_reserve_bytes`", num(static_cast<double>(memory.fixed_reserve_bytes) /
                                                   static_cast<double>(int64_t{1} << 30))},
  };
}

std::vector<Table> tables_headed(const std::string& first_header) {
  std::vector<Table> found;
  for (const Table& table : tables_of(presets_doc())) {
    if (!table.header.empty() && table.header.front() == first_header) found.push_back(table);
  }
  return found;
}

TEST(PresetDocs, EveryPresetTableCellIsThePresetFigure) {
  const std::vector<Table> tables = tables_headed("preset");
  ASSERT_EQ(tables.size(), 3u) << "docs/presets.md: GPU, links and NCCL tables";
  const std::vector<std::string> names = cluster_preset_names();
  for (const Table& table : tables) {
    std::set<std::string> seen;
    for (const Row& row : table.rows) {
      const std::string where = fmt::format("docs/presets.md table at line {}, row {}", table.line,
                                            row.empty() ? "" : row.front());
      ASSERT_EQ(row.size(), table.header.size()) << where;
      const ClusterSpec preset = cluster_preset(row.front());
      EXPECT_TRUE(seen.insert(row.front()).second) << where << ": preset listed twice";
      for (size_t i = 1; i < row.size(); ++i) {
        const auto column = preset_columns().find(table.header[i]);
        ASSERT_NE(column, preset_columns().end())
            << where << ": column \"" << table.header[i] << "\" is not checked by this test";
        if (column->second) {
          EXPECT_EQ(row[i], column->second(preset)) << where << ", column " << table.header[i];
        }
      }
    }
    EXPECT_EQ(seen, std::set<std::string>(names.begin(), names.end()))
        << "docs/presets.md table at line " << table.line << " must list every preset";
  }
}

TEST(PresetDocs, EveryConstantRowIsTheCodeConstant) {
  const std::vector<Table> tables = tables_headed("constant");
  ASSERT_EQ(tables.size(), 1u) << "docs/presets.md: the cost-model constants table";
  ASSERT_GE(tables.front().header.size(), 2u);
  EXPECT_EQ(tables.front().header[1], "value");
  std::map<std::string, std::string> expected = constants();
  for (const Row& row : tables.front().rows) {
    ASSERT_GE(row.size(), 2u);
    const auto constant = expected.find(row[0]);
    ASSERT_NE(constant, expected.end())
        << "docs/presets.md: " << row[0] << " is not a constant this test knows";
    EXPECT_EQ(row[1], constant->second) << "docs/presets.md: " << row[0];
    expected.erase(constant);
  }
  for (const auto& [name, value] : expected) {
    ADD_FAILURE() << "docs/presets.md: the constants table has no row for " << name << " (" << value
                  << ")";
  }
}

// The parser itself, on a document with a changed figure: the mismatch is what the tests
// above would report.
TEST(PresetDocs, ParserReadsCellsAndSkipsTheSeparator) {
  EXPECT_EQ(cells_of("| h100 | 989 | 0.32 |"), (Row{"h100", "989", "0.32"}));
  EXPECT_EQ(cells_of("| `kGemmTileM` | 128 | rows |"), (Row{"`kGemmTileM`", "128", "rows"}));
  const ClusterSpec h100 = cluster_preset("h100");
  EXPECT_EQ(preset_columns().at("attention eff.")(h100), "0.32");
  EXPECT_NE(preset_columns().at("attention eff.")(h100), "0.35");
  EXPECT_EQ(preset_columns().at("memory")(cluster_preset("h200")), "141 GiB");
  EXPECT_EQ(preset_columns().at("cross-node GB/s per GPU")(cluster_preset("a40")), "1.5");
}

}  // namespace
}  // namespace dhelix
