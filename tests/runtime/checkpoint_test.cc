// Checkpoint shards (bitwise round trip, exact errors on corrupt files), manifest.json
// (round trip, strict reading) and the commit protocol (publish, latest, crash leftovers).

#include "runtime/train/checkpoint.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/error.h"
#include "tests/runtime/error_of.h"
#include "tests/runtime/scratch_dir.h"

namespace dhelix::rt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPlanSha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr const char* kRunId = "00112233445566778899aabbccddeeff";

// The identity every shard of these tests carries: rank `rank` of 2 (tp = rank).
ShardIdentity identity_of(int64_t rank) {
  return {.plan_sha256 = kPlanSha, .run_id = kRunId, .world_size = 2, .coordinates = {.tp = rank}};
}

class CheckpointTest : public ::testing::Test {
 protected:
  test::ScratchDir scratch_{"dhelix-ckpt-"};
  std::string dir_ = scratch_.path();

  std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  // A shard with tensors "a" (3 values) and "b" (2 values): 200 header bytes (56 of them
  // the identity's integers, 96 its hex digits), 25 + 21 bytes of tensors, 8 checksum bytes
  // = 254 bytes; b's values start at 200 + 25 + 13 = 238.
  std::string write_small_shard(const std::string& step_dir) {
    RankShardView view;
    view.rank = 1;
    view.step = 4;
    view.identity = identity_of(1);
    view.tensors = {{"a", a_.data(), 3}, {"b", b_.data(), 2}};
    write_rank_shard(step_dir, view);
    return step_dir + "/rank-1.bin";
  }

  std::vector<float> a_ = {1.0f, 2.0f, 3.0f};
  std::vector<float> b_ = {-1.0f, 0.5f};
};

using test::error_of;

// An independent FNV-1a 64 to predict the checksum message.
uint64_t fnv1a64(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return hash;
}

std::string hex(uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::vector<uint32_t> bits(const std::vector<float>& values) {
  std::vector<uint32_t> out;
  for (const float value : values) out.push_back(std::bit_cast<uint32_t>(value));
  return out;
}

TEST_F(CheckpointTest, ShardRoundTripIsBitwise) {
  const std::vector<float> weights = {0.0f,
                                      -0.0f,
                                      1.5f,
                                      std::numeric_limits<float>::denorm_min(),
                                      std::numeric_limits<float>::infinity(),
                                      std::bit_cast<float>(0x7fc01234u)};
  const std::vector<float> moments = {3.25f, -7.0f, 1e-30f};
  RankShardView view;
  view.rank = 3;
  view.step = 12;
  view.data_position = 12;
  view.rng_state = 0xdeadbeefcafef00dull;
  view.identity = {.plan_sha256 = kPlanSha,
                   .run_id = kRunId,
                   .world_size = 8,
                   .coordinates = {.tp = 1, .cp = 0, .dp = 1, .pp = 0, .ep = 1}};
  view.tensors = {{"layers.0.w_qkv", weights.data(), 6},
                  {"adam_m/layers.0.w_qkv", moments.data(), 3},
                  {"empty", nullptr, 0}};
  // 200 + (4 + 14 + 8 + 24) + (4 + 21 + 8 + 12) + (4 + 5 + 8) + 8 = 320.
  EXPECT_EQ(rank_shard_bytes(view), 320);
  EXPECT_EQ(write_rank_shard(dir_, view), 320);
  const std::string path = dir_ + "/rank-3.bin";
  EXPECT_EQ(fs::file_size(path), 320u);

  const RankShard shard = read_rank_shard(path);
  EXPECT_EQ(shard.file, path);
  EXPECT_EQ(shard.rank, 3);
  EXPECT_EQ(shard.step, 12);
  EXPECT_EQ(shard.data_position, 12u);
  EXPECT_EQ(shard.rng_state, 0xdeadbeefcafef00dull);
  EXPECT_EQ(shard.identity.plan_sha256, kPlanSha);
  EXPECT_EQ(shard.identity.run_id, kRunId);
  EXPECT_EQ(shard.identity.world_size, 8);
  const RankCoordinates& c = shard.identity.coordinates;
  EXPECT_EQ(std::vector<int64_t>({c.pp, c.tp, c.cp, c.ep, c.dp}),
            std::vector<int64_t>({0, 1, 0, 1, 1}));
  ASSERT_EQ(shard.tensors.size(), 3u);
  EXPECT_EQ(shard.tensors[0].name, "layers.0.w_qkv");
  EXPECT_EQ(bits(shard.tensors[0].values), bits(weights));
  EXPECT_EQ(shard.tensors[1].name, "adam_m/layers.0.w_qkv");
  EXPECT_EQ(bits(shard.tensors[1].values), bits(moments));
  EXPECT_EQ(shard.tensors[2].name, "empty");
  EXPECT_TRUE(shard.tensors[2].values.empty());
  // The bytes are little-endian: the magic, then version 2, then rank 3; the world size at
  // 48, the plan hash at 96 and the run id at 160.
  const std::string bytes = read_bytes(path);
  EXPECT_EQ(bytes.substr(0, 8), std::string("DHXCKPT\0", 8));
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x02\0\0\0", 4));
  EXPECT_EQ(bytes.substr(16, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(48, 8), std::string("\x08\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(96, 64), kPlanSha);
  EXPECT_EQ(bytes.substr(160, 32), kRunId);
}

TEST_F(CheckpointTest, CopyIntoChecksNameAndCount) {
  const RankShard shard = read_rank_shard(write_small_shard(dir_));
  std::vector<float> out(3);
  shard.copy_into("a", out.data(), 3);
  EXPECT_EQ(out, a_);
  EXPECT_EQ(error_of([&] { shard.copy_into("c", out.data(), 3); }).second,
            shard.file + ": the checkpoint has no tensor \"c\"");
  EXPECT_EQ(error_of([&] { shard.copy_into("b", out.data(), 3); }).second,
            shard.file + ": tensor \"b\" has 2 values, the model expects 3");
}

TEST_F(CheckpointTest, TruncatedShardIsNamedWithWhatIsMissing) {
  const std::string path = write_small_shard(dir_);
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 254u);
  write_bytes(path, bytes.substr(0, 244));
  const auto [code, message] = error_of([&] { read_rank_shard(path); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message, path +
                         ": truncated: reading tensor 1 \"b\" values at offset 238 needs 2 "
                         "floats of 4 bytes, but the file has only 244 bytes");
  // Cut inside the checksum.
  write_bytes(path, bytes.substr(0, 249));
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path +
                ": truncated: reading the checksum at offset 246 needs 8 bytes, but the file "
                "has only 249 bytes");
  // Cut inside the magic.
  write_bytes(path, bytes.substr(0, 5));
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path +
                ": truncated: reading the magic bytes at offset 0 needs 8 bytes, but the file "
                "has only 5 bytes");
}

TEST_F(CheckpointTest, FlippedByteFailsTheChecksum) {
  const std::string path = write_small_shard(dir_);
  std::string bytes = read_bytes(path);
  bytes[213] = static_cast<char>(bytes[213] ^ 0x01);  // the first value of "a"
  write_bytes(path, bytes);
  const uint64_t computed = fnv1a64(bytes.substr(0, 246));
  uint64_t stored = 0;
  for (int i = 7; i >= 0; --i) stored = (stored << 8) | static_cast<unsigned char>(bytes[246 + i]);
  const auto [code, message] = error_of([&] { read_rank_shard(path); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message, path + ": checksum mismatch: the file stores " + hex(stored) +
                         " but its bytes hash to " + hex(computed) + "; the shard is corrupt");
}

TEST_F(CheckpointTest, WrongMagicVersionOrCountsAreRefused) {
  const std::string path = write_small_shard(dir_);
  const std::string good = read_bytes(path);

  std::string bytes = good;
  bytes[0] = 'X';
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path +
                ": not a dhelix checkpoint shard: it does not start with the magic bytes "
                "\"DHXCKPT\\0\"");

  bytes = good;
  bytes[8] = 3;
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": shard format version 3; this dhelix reads version 2");
  bytes[8] = 1;  // the format without run identity
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path +
                ": shard format version 1; this dhelix reads version 2 (version 1 shards carry "
                "no run identity: train again from step 0 or resume with the dhelix that wrote "
                "them)");

  // A tensor count of 2^40 must be refused before anything is allocated.
  bytes = good;
  bytes[192 + 5] = 1;
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": truncated or corrupt: 1099511627778 tensors cannot fit in the 54 bytes left");

  // A value count of 2^62 + 3 for "a".
  bytes = good;
  bytes[205 + 7] = 0x40;
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path +
                ": truncated: reading tensor 0 \"a\" values at offset 213 needs "
                "4611686018427387907 floats of 4 bytes, but the file has only 254 bytes");

  // An identity that is not hex digits, a rank outside its world.
  bytes = good;
  bytes[96] = 'G';
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": corrupt: the plan hash is not 64 lowercase hexadecimal digits");
  bytes = good;
  bytes[48] = 1;  // world size 1, rank 1
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": corrupt: rank 1 of a world of 1 ranks");

  write_bytes(path, good + "x");
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": corrupt: the file has 255 bytes, 1 more than its tensors and checksum take");

  write_bytes(path, "");
  EXPECT_EQ(error_of([&] { read_rank_shard(path); }).second,
            path + ": the file is empty, it is not a checkpoint shard");

  const auto [code, message] = error_of([&] { read_rank_shard(dir_ + "/rank-9.bin"); });
  EXPECT_EQ(code, ErrorCode::kIo);
  EXPECT_EQ(message, dir_ + "/rank-9.bin: cannot read checkpoint shard: No such file or directory");
}

TEST_F(CheckpointTest, EveryTruncationAndAFlippedBitInEveryByteAreRefused) {
  const std::string path = write_small_shard(dir_);
  const std::string good = read_bytes(path);
  for (size_t length = 0; length < good.size(); ++length) {
    write_bytes(path, good.substr(0, length));
    EXPECT_EQ(error_of([&] { read_rank_shard(path); }).first, ErrorCode::kInvalidInput)
        << "length " << length;
  }
  // One bit of every byte, a different bit position from byte to byte.
  for (size_t byte = 0; byte < good.size(); ++byte) {
    std::string bytes = good;
    bytes[byte] = static_cast<char>(bytes[byte] ^ (1 << (byte % 8)));
    write_bytes(path, bytes);
    EXPECT_EQ(error_of([&] { read_rank_shard(path); }).first, ErrorCode::kInvalidInput)
        << "byte " << byte;
  }
}

// Writes a complete two-rank checkpoint of `step` into its temporary directory.
void write_checkpoint(const std::string& dir, int64_t step, float value) {
  const std::string temporary = prepare_temporary_step_dir(dir, step);
  for (int64_t rank = 0; rank < 2; ++rank) {
    RankShardView view;
    view.rank = rank;
    view.step = step;
    view.identity = identity_of(rank);
    view.tensors = {{"w", &value, 1}};
    write_rank_shard(temporary, view);
  }
  write_manifest(temporary, make_manifest(temporary, "tiny", step, 2, kPlanSha, kRunId));
}

TEST_F(CheckpointTest, PublishMakesLatestNameTheNewStep) {
  EXPECT_EQ(latest_step(dir_), std::nullopt);
  EXPECT_EQ(temporary_step_dir(dir_, 5), dir_ + "/step-5.tmp");
  write_checkpoint(dir_, 5, 1.0f);
  EXPECT_EQ(latest_step(dir_), std::nullopt);  // not published yet
  publish_step(dir_, 5);
  EXPECT_EQ(latest_step(dir_), 5);
  EXPECT_EQ(read_bytes(dir_ + "/latest"), "step-5\n");
  EXPECT_FALSE(fs::exists(dir_ + "/step-5.tmp"));
  const CheckpointManifest manifest = read_manifest(dir_ + "/step-5/manifest.json");
  check_manifest_shards(dir_ + "/step-5", manifest);
  EXPECT_EQ(read_rank_shard(dir_ + "/step-5/rank-1.bin").tensors[0].values,
            std::vector<float>{1.0f});

  // A re-run of step 5 replaces it and leaves no step-5.old behind.
  write_checkpoint(dir_, 5, 2.0f);
  publish_step(dir_, 5);
  EXPECT_EQ(read_rank_shard(dir_ + "/step-5/rank-1.bin").tensors[0].values,
            std::vector<float>{2.0f});
  EXPECT_FALSE(fs::exists(dir_ + "/step-5.old"));
  EXPECT_EQ(latest_step(dir_), 5);
}

TEST_F(CheckpointTest, CrashedWriteNeverBecomesLatestAndIsRemoved) {
  write_checkpoint(dir_, 5, 1.0f);
  publish_step(dir_, 5);
  // A crash while writing step 10: shards in step-10.tmp, a stray temporary of `latest`.
  write_checkpoint(dir_, 10, 2.0f);
  write_bytes(dir_ + "/latest.tmp.AbC123", "step-1");
  EXPECT_EQ(latest_step(dir_), 5);
  EXPECT_EQ(remove_stale_temporaries(dir_),
            (std::vector<std::string>{dir_ + "/latest.tmp.AbC123", dir_ + "/step-10.tmp"}));
  EXPECT_FALSE(fs::exists(dir_ + "/step-10.tmp"));
  EXPECT_TRUE(fs::exists(dir_ + "/step-5/rank-0.bin"));
  EXPECT_EQ(latest_step(dir_), 5);
  EXPECT_TRUE(remove_stale_temporaries(dir_).empty());
  EXPECT_TRUE(remove_stale_temporaries(dir_ + "/nowhere").empty());
}

TEST_F(CheckpointTest, CrashInsideARepublishIsRestored) {
  write_checkpoint(dir_, 5, 1.0f);
  publish_step(dir_, 5);
  // publish_step of a re-run moved step-5 aside and died before renaming the new one in.
  write_checkpoint(dir_, 5, 2.0f);
  fs::rename(dir_ + "/step-5", dir_ + "/step-5.old");
  const auto [code, message] = error_of([&] { latest_step(dir_); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message,
            dir_ + "/latest: names step-5, but " + dir_ + "/step-5/manifest.json does not exist");
  EXPECT_EQ(remove_stale_temporaries(dir_),
            (std::vector<std::string>{dir_ + "/step-5.old", dir_ + "/step-5.tmp"}));
  EXPECT_EQ(latest_step(dir_), 5);
  EXPECT_EQ(read_rank_shard(dir_ + "/step-5/rank-0.bin").tensors[0].values,
            std::vector<float>{1.0f});
}

TEST_F(CheckpointTest, MalformedLatestAndMissingTemporaryAreErrors) {
  write_bytes(dir_ + "/latest", "step-07\n");
  EXPECT_EQ(error_of([&] { latest_step(dir_); }).second,
            dir_ + "/latest: \"step-07\" does not name a checkpoint; it must hold \"step-<N>\"");
  const auto [code, message] = error_of([&] { publish_step(dir_, 3); });
  EXPECT_EQ(code, ErrorCode::kIo);
  EXPECT_EQ(message, dir_ + "/step-3.tmp: cannot publish checkpoint: the directory does not exist");
}

TEST_F(CheckpointTest, ManifestRoundTripsAndIsWrittenInSchemaOrder) {
  CheckpointManifest manifest;
  manifest.meta = {{"tool", "dhelix-run"}};
  manifest.job = "tiny";
  manifest.step = 8;
  manifest.world_size = 2;
  manifest.plan_sha256 = kPlanSha;
  manifest.run_id = kRunId;
  manifest.shards = {{0, "rank-0.bin", 100}, {1, "rank-1.bin", 120}};
  write_manifest(dir_, manifest);
  const std::string text = read_bytes(dir_ + "/manifest.json");
  EXPECT_EQ(text, std::string("{\n"
                              "  \"schema_version\": \"2.0.0\",\n"
                              "  \"meta\": {\n"
                              "    \"tool\": \"dhelix-run\"\n"
                              "  },\n"
                              "  \"job\": \"tiny\",\n"
                              "  \"step\": 8,\n"
                              "  \"world_size\": 2,\n"
                              "  \"plan_sha256\": \"") +
                      kPlanSha +
                      "\",\n"
                      "  \"run_id\": \"" +
                      kRunId +
                      "\",\n"
                      "  \"shard_format_version\": 2,\n"
                      "  \"shards\": [\n"
                      "    {\n"
                      "      \"rank\": 0,\n"
                      "      \"file\": \"rank-0.bin\",\n"
                      "      \"bytes\": 100\n"
                      "    },\n"
                      "    {\n"
                      "      \"rank\": 1,\n"
                      "      \"file\": \"rank-1.bin\",\n"
                      "      \"bytes\": 120\n"
                      "    }\n"
                      "  ]\n"
                      "}\n");
  const CheckpointManifest read = read_manifest(dir_ + "/manifest.json");
  EXPECT_EQ(manifest_to_json(read), manifest_to_json(manifest));
}

TEST_F(CheckpointTest, ManifestReaderIsStrict) {
  const std::string path = dir_ + "/manifest.json";
  write_bytes(path, std::string(R"({"schema_version": "2.0.0", "meta": {}, "job": "tiny",
    "stpe": 8, "world_size": 2, "plan_sha256": "ABC", "run_id": "x", "shard_format_version": 2,
    "shards": [{"rank": 0, "file": "rank-0.bin", "bytes": 1},
               {"rank": 2, "file": "rank-2.bin", "bytes": 1, "byte": 2}]})"));
  const auto [code, message] = error_of([&] { read_manifest(path); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message, path + ": /step: is required but missing\n" + path +
                         ": /plan_sha256: \"ABC\" must be 64 lowercase hexadecimal digits (a "
                         "SHA-256)\n" +
                         path + ": /run_id: \"x\" must be 32 lowercase hexadecimal digits\n" +
                         path + ": /shards/1/byte: unknown key (did you mean \"bytes\"?)\n" + path +
                         ": /shards/1/rank: 2 must be 1: shards are listed in rank order\n" + path +
                         ": /stpe: unknown key (did you mean \"step\"?)");

  // Version 1 manifests (and shards) had no run identity.
  write_bytes(path, R"({"schema_version": "1.0.0", "plan_sha256": "", "shards": []})");
  EXPECT_EQ(error_of([&] { read_manifest(path); }).first, ErrorCode::kSchemaVersion);
}

TEST_F(CheckpointTest, ShardsAndRunAreCheckedAgainstTheManifest) {
  write_checkpoint(dir_, 3, 1.0f);
  const std::string temporary = temporary_step_dir(dir_, 3);
  CheckpointManifest manifest = read_manifest(temporary + "/manifest.json");
  EXPECT_EQ(manifest.shards[1].bytes, 200 + 4 + 1 + 8 + 4 + 8);
  manifest.shards[0].bytes = 7;
  fs::remove(temporary + "/rank-1.bin");
  EXPECT_EQ(error_of([&] { check_manifest_shards(temporary, manifest); }).second,
            temporary + "/rank-0.bin: 225 bytes differ from the 7 bytes manifest.json lists\n" +
                temporary + "/rank-1.bin: is missing: the checkpoint is incomplete");

  check_resume_matches(manifest, "m.json", "tiny", 2, kPlanSha);
  const std::string other(64, 'f');
  EXPECT_EQ(error_of([&] { check_resume_matches(manifest, "m.json", "big", 4, other); }).second,
            "m.json: /world_size: 2 differs from this run's 4 ranks\n"
            "m.json: /plan_sha256: " +
                std::string(kPlanSha) + " differs from this run's plan (" + other +
                "): the checkpoint was written under another plan\n"
                "m.json: /job: \"tiny\" differs from this run's job \"big\"");
}

}  // namespace
}  // namespace dhelix::rt
