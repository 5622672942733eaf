#include "lib/provenance.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dhelix_version.h"

namespace dhelix {
namespace {

// FIPS 180-4 examples (NIST "Example Algorithm" documents for SHA-256).
TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries: 55 bytes still fit one padded block, 56 need two;
// 64 is a full block plus a padding block. Reference digests from Python's hashlib.
TEST(Sha256, PaddingBoundaries) {
  EXPECT_EQ(sha256_hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(63, 'a')),
            "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  EXPECT_EQ(sha256_hex(std::string(119, 'a')),
            "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb");
}

TEST(Sha256, FileHashIsTheHashOfItsBytes) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dhelix_provenance_test.txt").string();
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_EQ(sha256_file_hex(path), sha256_hex("abc"));
  std::filesystem::remove(path);
  try {
    sha256_file_hex(path);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_EQ(std::string(error.what()), path + ": cannot open file for reading");
  }
}

TEST(Provenance, VersionText) {
  EXPECT_EQ(tool_version_text("dhelix-plan"),
            std::string("dhelix-plan ") + DHELIX_VERSION + " (git " + DHELIX_GIT_HASH + ")");
}

TEST(Provenance, DeterministicModeLeavesOutHostAndDate) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dhelix_provenance_input.json").string();
  std::ofstream(path, std::ios::binary) << "abc";
  ::setenv("DHELIX_DETERMINISTIC", "1", 1);
  const Provenance fixed = make_provenance("dhelix-plan", {"dhelix-plan", path}, {path, "", path});
  EXPECT_TRUE(deterministic_output());
  EXPECT_EQ(fixed.host, "");
  EXPECT_EQ(fixed.date_utc, "");
  ASSERT_EQ(fixed.inputs.size(), 1u);  // duplicates and "" are skipped
  EXPECT_EQ(fixed.inputs[0].sha256, sha256_hex("abc"));
  const OrderedJson json = provenance_to_json(fixed);
  EXPECT_EQ(json.dump(), std::string(R"({"tool":"dhelix-plan","version":")") + DHELIX_VERSION +
                             R"(","git_hash":")" + DHELIX_GIT_HASH +
                             R"(","argv":["dhelix-plan",")" + path + R"("],"inputs":[{"path":")" +
                             path + R"(","sha256":")" + sha256_hex("abc") + R"("}]})");

  ::unsetenv("DHELIX_DETERMINISTIC");
  const Provenance live = make_provenance("dhelix-plan", {"dhelix-plan"}, {});
  EXPECT_FALSE(deterministic_output());
  EXPECT_FALSE(live.host.empty());
  ASSERT_EQ(live.date_utc.size(), 20u);  // 2025-01-31T12:00:00Z
  EXPECT_EQ(live.date_utc[10], 'T');
  EXPECT_EQ(live.date_utc.back(), 'Z');
  EXPECT_TRUE(provenance_to_json(live).contains("date_utc"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dhelix
