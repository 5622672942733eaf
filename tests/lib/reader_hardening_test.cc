// Regression tests for inputs that fuzzing and the bad-input table (docs/reliability.md)
// found mishandled: each must be a dhelix::Error with a clear message, never another
// exception type (which a tool reports as an internal error, exit 70) or a crash.

#include <gtest/gtest.h>

#include <string>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/json_reader.h"

namespace dhelix {
namespace {

// The message of the Error `text` raises when parsed as "f.json"; fails the test otherwise.
std::string parse_error_message(const std::string& text) {
  try {
    parse_json_text(text, "f.json");
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  ADD_FAILURE() << "expected an Error for " << text;
  return "";
}

TEST(ReaderHardeningTest, NumberBeyondADoubleIsInvalidJsonNotAnInternalError) {
  // nlohmann throws out_of_range.406 (not parse_error) for a number that overflows a double.
  EXPECT_EQ(parse_error_message("{\"hidden_size\": 1e400}"),
            "f.json: not valid JSON: number overflow parsing '1e400'");
  EXPECT_EQ(parse_error_message("[-1e400]"),
            "f.json: not valid JSON: number overflow parsing '-1e400'");
}

TEST(ReaderHardeningTest, DeepNestingIsAnErrorNotAStackOverflow) {
  // 200000 levels used to parse, then overflow the stack when a reader dumped the value
  // into its message. 512 levels are allowed: with the root object as level 1, the 512th
  // '[' (offset 9 + 511, column 521) is level 513 and is refused where it stands.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_EQ(parse_error_message("{\"name\": " + deep + "}"),
            "f.json:1:521: arrays and objects nest more than 512 deep");
  const std::string allowed = std::string(512, '[') + std::string(512, ']');
  EXPECT_TRUE(parse_json_text(allowed, "f.json").is_array());
  // Brackets inside strings do not count.
  EXPECT_TRUE(parse_json_text("[\"" + std::string(1000, '[') + "\"]", "f.json").is_array());
}

TEST(ReaderHardeningTest, NodeAndGpuCountsAreBoundedSoWorldSizesCannotOverflow) {
  // num_nodes = 2^62 with 8 GPUs per node overflowed num_nodes · gpus_per_node (UBSan in the
  // job fuzzer); each count is now at most 2^20.
  const Json json = parse_json_text(R"({"schema_version": "1.0.0", "name": "big", "base": "a40",
      "num_nodes": 4611686018427387904, "gpus_per_node": 1048577, "nics_per_node": 1048576})",
                                    "c.json");
  ProblemList problems;
  cluster_from_json(json, "c.json", problems);
  ASSERT_EQ(problems.problems().size(), 2u);
  EXPECT_EQ(problems.problems()[0].to_string(),
            "c.json: /gpus_per_node: 1048577 must be at most 1048576");
  EXPECT_EQ(problems.problems()[1].to_string(),
            "c.json: /num_nodes: 4611686018427387904 must be at most 1048576");
}

}  // namespace
}  // namespace dhelix
