#include "lib/json_reader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dhelix {
namespace {

// Reads `text` as the root object of "f.json" and returns the problems, one per line.
struct Fixture {
  explicit Fixture(const std::string& text) : json(parse_json_text(text, "f.json")) {}
  Json json;
  ProblemList problems;
  ObjectReader reader() { return ObjectReader(json, "f.json", "", problems); }
  std::string messages() const {
    std::string out;
    for (const Problem& problem : problems.problems()) out += problem.to_string() + "\n";
    return out;
  }
};

TEST(ParseJsonTextTest, NamesLineAndColumnOfASyntaxError) {
  try {
    parse_json_text("{\n  \"a\": 1,\n  \"b\": }\n", "model.json");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_EQ(std::string(error.what()).rfind("model.json:3:8: not valid JSON", 0), 0u)
        << error.what();
  }
}

TEST(ParseJsonTextTest, KeepsTheReasonAndDropsTheLastReadTail) {
  // A file cut in the middle of a string: nlohmann's message ends with
  // "; last read: '"all_gather:bf16:by'", which must not replace the reason.
  try {
    parse_json_text("{\n  \"op\": \"all_gather:bf16:by", "p.json");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    // Line 2 holds 27 characters; the input ends just after them, at column 28.
    EXPECT_STREQ(error.what(),
                 "p.json:2:28: not valid JSON: syntax error while parsing value - invalid "
                 "string: missing closing quote");
  }
}

std::string parse_error_of(const std::string& text) {
  try {
    parse_json_text(text, "job.json");
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    return error.what();
  }
  return "accepted";
}

// nlohmann keeps the last of two equal keys: "tp": 4, "tp": 8 silently meant 8.
TEST(ParseJsonTextTest, DuplicateKeysAreRefusedWithBothPositions) {
  EXPECT_EQ(parse_error_of("{\n  \"parallel\": {\"tp\": 4,\n    \"tp\": 8}\n}\n"),
            "job.json:3:5: /parallel/tp: duplicate key (first at line 2, column 16); each key "
            "may appear once in an object");
  // An escape spells the same key; pointers count array elements.
  EXPECT_EQ(parse_error_of("{\"a\": [1, {\"b\": 0}, {\"k\": 1, \"\\u006b\": 2}]}"),
            "job.json:1:30: /a/2/k: duplicate key (first at line 1, column 22); each key may "
            "appear once in an object");
  // The same key in different objects, and a key-like string value, are fine.
  EXPECT_EQ(parse_error_of("{\"a\": {\"x\": 1}, \"b\": {\"x\": \"x\"}, \"c\": [\"a\", \"a\"]}"),
            "accepted");
}

// /dev/zero made every reader read until memory ran out; now no device is read at all.
TEST(ReadJsonFileTest, DevicesAreRefused) {
  try {
    read_json_file("/dev/zero");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(error.what())
                  .find("/dev/zero: is a character device, not a regular "
                        "file"),
              std::string::npos)
        << error.what();
  }
}

// A FIFO nobody writes made the reader wait forever in open(2).
TEST(ReadJsonFileTest, FifoIsRefusedWithoutWaiting) {
  const std::string fifo =
      (std::filesystem::temp_directory_path() / ("dhelix-json-fifo-" + std::to_string(::getpid())))
          .string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_json_file(fifo);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(error.what()).find(": is a FIFO (named pipe), not a regular file"),
              std::string::npos)
        << error.what();
  }
  ::unlink(fifo.c_str());
}

// A regular file is bounded by its size before a byte of it is read.
TEST(ReadJsonFileTest, ReadsAreBoundedBySize) {
  const std::string big =
      (std::filesystem::temp_directory_path() / ("dhelix-json-big-" + std::to_string(::getpid())))
          .string();
  std::ofstream(big).close();
  std::filesystem::resize_file(big, (size_t{256} << 20) + 1);  // sparse: no disk used
  try {
    read_json_file(big);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_EQ(std::string(error.what()),
              big + ": is larger than 256 MiB, the most dhelix reads from a JSON file");
  }
  std::filesystem::remove(big);
}

TEST(ReadJsonFileTest, DirectoryIsAnIoError) {
  const std::string directory = std::filesystem::temp_directory_path().string();
  try {
    read_json_file(directory);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_EQ(std::string(error.what()), directory + ": is a directory, expected a file");
  }
}

TEST(ReadJsonFileTest, MissingFileIsAnIoError) {
  try {
    read_json_file("/nonexistent/dhelix/job.json");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_STREQ(error.what(), "/nonexistent/dhelix/job.json: cannot open file for reading");
  }
}

TEST(ObjectReaderTest, ReadsTypedFields) {
  Fixture f(R"({"tp": 8, "big": 1e3, "bw": 24.5, "sp": true, "name": "x"})");
  ObjectReader root = f.reader();
  EXPECT_EQ(root.integer("tp", Need::kRequired), 8);
  EXPECT_EQ(root.integer("big", Need::kRequired), 1000);
  EXPECT_DOUBLE_EQ(*root.real("bw", Need::kRequired), 24.5);
  EXPECT_EQ(root.boolean("sp", Need::kRequired), true);
  EXPECT_EQ(root.string("name", Need::kRequired), "x");
  EXPECT_EQ(root.integer("absent", Need::kOptional), std::nullopt);
  root.finish();
  EXPECT_TRUE(f.problems.empty()) << f.messages();
}

TEST(ObjectReaderTest, ReportsEveryProblemWithPointerValueAndRule) {
  Fixture f(R"({"tp": 2.5, "pp": -1, "sp": "yes", "bw": 0, "dtype": "bf61", "tpp": 1})");
  ObjectReader root = f.reader();
  root.integer("tp", Need::kRequired, {.min = 1});
  root.integer("pp", Need::kRequired, {.min = 1});
  root.boolean("sp", Need::kRequired);
  root.real("bw", Need::kRequired, {.min = 0, .min_exclusive = true});
  root.string("dtype", Need::kRequired, {"bf16", "fp16", "fp32"});
  root.integer("layers", Need::kRequired);
  root.finish();
  EXPECT_EQ(f.messages(),
            "f.json: /tp: 2.5 is a number, expected an integer\n"
            "f.json: /pp: -1 must be at least 1\n"
            "f.json: /sp: \"yes\" is string, expected true or false\n"
            "f.json: /bw: 0 must be greater than 0\n"
            "f.json: /dtype: \"bf61\" is not one of bf16, fp16, fp32 (did you mean \"bf16\"?)\n"
            "f.json: /layers: is required but missing\n"
            "f.json: /tpp: unknown key (did you mean \"tp\"?)\n");
}

TEST(ObjectReaderTest, NestedObjectsCarryTheirPointer) {
  Fixture f(R"({"parallel": {"tp": 0, "dp~/x": 1}})");
  ObjectReader root = f.reader();
  std::optional<ObjectReader> parallel = root.object("parallel", Need::kRequired);
  ASSERT_TRUE(parallel.has_value());
  parallel->integer("tp", Need::kRequired, {.min = 1});
  parallel->finish();
  root.finish();
  EXPECT_EQ(f.messages(),
            "f.json: /parallel/tp: 0 must be at least 1\n"
            "f.json: /parallel/dp~0~1x: unknown key\n");
}

TEST(ObjectReaderTest, RejectsIntegersBeyondInt64) {
  Fixture f(R"({"n": 18446744073709551615})");
  ObjectReader root = f.reader();
  root.integer("n", Need::kRequired);
  EXPECT_EQ(f.messages(), "f.json: /n: 18446744073709551615 is too large\n");
}

TEST(ObjectReaderTest, IntegralFloatsBeyondInt64AreTooLarge) {
  Fixture f(R"({"n": 1e30, "m": -1e30, "k": 2.5e3})");
  ObjectReader root = f.reader();
  root.integer("n", Need::kRequired);
  root.integer("m", Need::kRequired);
  EXPECT_EQ(root.integer("k", Need::kRequired), 2500);
  EXPECT_EQ(f.messages(),
            "f.json: /n: 1e+30 is too large\n"
            "f.json: /m: -1e+30 is too small\n");
}

TEST(ObjectReaderTest, NonObjectRootIsOneProblem) {
  Fixture f("[1, 2]");
  ObjectReader root = f.reader();
  EXPECT_FALSE(root.is_object());
  EXPECT_EQ(root.integer("tp", Need::kRequired), std::nullopt);
  root.finish();
  EXPECT_EQ(f.messages(), "f.json: /: [1,2] is array, expected an object\n");
}

TEST(SchemaVersionTest, AcceptsTheSameMajorVersion) {
  Fixture f(R"({"schema_version": "1.4.2"})");
  ObjectReader root = f.reader();
  check_schema_version(root, 1);
  EXPECT_TRUE(f.problems.empty()) << f.messages();
}

TEST(SchemaVersionTest, RefusesAnotherMajorVersion) {
  Fixture f(R"({"schema_version": "2.0.0"})");
  ObjectReader root = f.reader();
  try {
    check_schema_version(root, 1);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kSchemaVersion);
    EXPECT_STREQ(error.what(),
                 "f.json: /schema_version: \"2.0.0\" has major version 2, this dhelix reads "
                 "major version 1 only");
  }
}

TEST(SchemaVersionTest, MalformedOrMissingVersionIsAProblem) {
  Fixture malformed(R"({"schema_version": "1.0"})");
  ObjectReader root = malformed.reader();
  check_schema_version(root, 1);
  EXPECT_EQ(malformed.messages(),
            "f.json: /schema_version: \"1.0\" must have the form major.minor.patch (e.g. "
            "\"1.0.0\")\n");
  Fixture missing("{}");
  ObjectReader empty = missing.reader();
  check_schema_version(empty, 1);
  EXPECT_EQ(missing.messages(), "f.json: /schema_version: is required but missing\n");
}

TEST(SchemaVersionTest, OutOfRangeOrSignedComponentsAreMalformed) {
  // sscanf("%d") wrapped 99999999999 to 1215752191 and reported a wrong major version.
  for (const char* version : {"99999999999.0.0", "1.-1.0", "1.0.0x", "1..0", "+1.0.0"}) {
    Fixture f(std::string(R"({"schema_version": ")") + version + "\"}");
    ObjectReader root = f.reader();
    check_schema_version(root, 1);
    EXPECT_EQ(f.messages(), std::string("f.json: /schema_version: \"") + version +
                                "\" must have the form major.minor.patch (e.g. \"1.0.0\")\n");
  }
}

}  // namespace
}  // namespace dhelix
