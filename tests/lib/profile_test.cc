#include "lib/profile.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix {
namespace {

Profile small_profile() {
  Profile profile;
  profile.meta = {{"tool", "dhelix-profile"}};
  profile.cluster = {{"name", "a40"}};
  profile.model_name = "llama-25b";
  profile.parallel = {{"tp", 8}};
  profile.add_op({.signature = "gemm:bf16:m=8,n=8,k=8",
                  .kind = OpKind::kGemm,
                  .stream = StreamClass::kCompute,
                  .example_op_id = "fwd.gemm_qkv",
                  .time_us = TimeStats::exactly(10.0),
                  .samples = 1});
  profile.add_op({.signature = "all_gather:bf16:bytes=64:tp8:local",
                  .kind = OpKind::kAllGather,
                  .stream = StreamClass::kLocalComm,
                  .example_op_id = "fwd.ag",
                  .time_us = {20.0, 19.0, 21.0, 18.5, 22.123456},
                  .samples = 5});
  // Stored as given when a < b; 10 + 20 - 25 = 5, / 10 = 0.5.
  profile.add_pair({.a = "gemm:bf16:m=8,n=8,k=8",
                    .b = "all_gather:bf16:bytes=64:tp8:local",
                    .finish_a_us = 12,
                    .finish_b_us = 25,
                    .makespan_us = 25,
                    .oef = 0.5});
  return profile;
}

std::string message_of(const Json& json) {
  try {
    profile_from_json(json, "p.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Profile, OverlapEffectiveness) {
  EXPECT_DOUBLE_EQ(overlap_effectiveness(10, 20, 25), 0.5);  // (10 + 20 - 25) / 10
  EXPECT_DOUBLE_EQ(overlap_effectiveness(10, 20, 30), 0.0);
  EXPECT_DOUBLE_EQ(overlap_effectiveness(10, 20, 20), 1.0);
  EXPECT_DOUBLE_EQ(overlap_effectiveness(0, 20, 20), 1.0);
}

TEST(Profile, PairsAreStoredCanonicallyAndFoundInEitherOrder) {
  const Profile profile = small_profile();
  ASSERT_EQ(profile.pairs().size(), 1u);
  // "all_gather..." < "gemm...": stored swapped.
  EXPECT_EQ(profile.pairs()[0].a, "all_gather:bf16:bytes=64:tp8:local");
  EXPECT_DOUBLE_EQ(profile.pairs()[0].finish_a_us, 25);
  const auto asked =
      profile.find_pair("gemm:bf16:m=8,n=8,k=8", "all_gather:bf16:bytes=64:tp8:local");
  ASSERT_TRUE(asked);
  EXPECT_EQ(asked->a, "gemm:bf16:m=8,n=8,k=8");
  EXPECT_DOUBLE_EQ(asked->finish_a_us, 12);
  EXPECT_DOUBLE_EQ(asked->finish_b_us, 25);
  EXPECT_FALSE(profile.find_pair("gemm:bf16:m=8,n=8,k=8", "gemm:bf16:m=8,n=8,k=8"));
  EXPECT_EQ(profile.find_op("nope"), nullptr);
}

TEST(Profile, MissingSignaturesAreListedOnceInOrder) {
  const Profile profile = small_profile();
  Op covered;
  covered.kind = OpKind::kGemm;
  covered.shape = {.m = 8, .n = 8, .k = 8};
  Op other = covered;
  other.shape.m = 16;
  Op norm;
  norm.kind = OpKind::kNorm;
  norm.shape = {.m = 4, .n = 4};
  ASSERT_EQ(covered.signature(), "gemm:bf16:m=8,n=8,k=8");
  const std::vector<std::string> missing =
      profile.missing_signatures({covered, other, norm, other});
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0], other.signature());
  EXPECT_EQ(missing[1], norm.signature());
}

TEST(Profile, JsonRoundTripAndFixedPrecision) {
  const Profile profile = small_profile();
  const std::string text = profile_to_text(profile);
  EXPECT_NE(text.find("\"max\": 22.1235"), std::string::npos);  // 4 decimals
  EXPECT_EQ(text.find("22.123456"), std::string::npos);
  const Profile back = profile_from_json(Json::parse(text), "p.json");
  EXPECT_EQ(profile_to_text(back), text);
  EXPECT_EQ(back.model_name, "llama-25b");
  EXPECT_EQ(back.ops()[1].samples, 5);
  EXPECT_DOUBLE_EQ(back.ops()[1].time_us.p10_us, 19.0);
  // Key order is fixed.
  const std::string expected_start = "{\n  \"schema_version\": \"1.0.0\",\n  \"meta\": {";
  EXPECT_EQ(text.substr(0, expected_start.size()), expected_start);
}

TEST(Profile, WrittenAtomicallyAndReadBack) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dhelix_profile_test.json").string();
  write_profile(path, small_profile());
  EXPECT_EQ(profile_to_text(read_profile(path)), profile_to_text(small_profile()));
  std::filesystem::remove(path);
}

TEST(Profile, ReaderRejectsUnknownKeysAndBadValues) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["opz"] = 1;
  json["ops"][0]["time_us"]["median"] = -1.0;
  json["ops"][1]["stream"] = "local";
  json["backend"] = "gpu";
  // Both ops are bad, so the pair naming them is not checked (its check would only repeat
  // the ops' problems).
  EXPECT_EQ(message_of(json),
            "p.json: /backend: \"gpu\" is not one of model, cpu, cuda (did you mean \"cpu\"?)\n"
            "p.json: /ops/0/time_us/median: -1.0 must be at least 0\n"
            "p.json: /ops/1/stream: \"local\" is not one of compute, local_comm, cross_comm\n"
            "p.json: /opz: unknown key (did you mean \"ops\"?)");
}

TEST(Profile, OneBadOpDoesNotCascadeIntoItsPairs) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["ops"][0]["time_us"]["p90"] = "slow";
  // Before, the gemm op was kept with p90 = 0 and the pair failed its OEF check too.
  EXPECT_EQ(message_of(json), "p.json: /ops/0/time_us/p90: \"slow\" is string, expected a number");
  json["ops"][0]["time_us"]["p90"] = 10.0;
  json["ops"][0]["time_us"]["median"] = -5.0;
  EXPECT_EQ(message_of(json), "p.json: /ops/0/time_us/median: -5.0 must be at least 0");
}

TEST(Profile, HugeNumbersInMessagesAreShort) {
  Json json = Json::parse(profile_to_text(small_profile()));
  // (10 + 20 - 1e12) / 10: printed with {:.4f} this was 300 digits at 1e308.
  json["pairs"][0]["finish_b_us"] = kMaxProfileTimeUs;
  json["pairs"][0]["makespan_us"] = kMaxProfileTimeUs;
  EXPECT_EQ(message_of(json),
            "p.json: /pairs/0/oef: 0.5 does not follow from the median times and makespan_us "
            "((T_a + T_b - makespan) / min(T_a, T_b) = -1e+11)");
}

// Times past 1e12 us (11.6 days) are refused: 1e300 us once planned a 300-digit iteration.
TEST(Profile, TimesPastTheLargestAreRefused) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["pairs"][0]["finish_b_us"] = 1e308;
  json["pairs"][0]["makespan_us"] = 1e308;
  EXPECT_EQ(message_of(json),
            "p.json: /pairs/0/finish_b_us: 1e+308 must be at most 1000000000000\n"
            "p.json: /pairs/0/makespan_us: 1e+308 must be at most 1000000000000");
  json = Json::parse(profile_to_text(small_profile()));
  json["ops"][0]["time_us"]["max"] = 1.5e12;
  EXPECT_EQ(message_of(json),
            "p.json: /ops/0/time_us/max: 1500000000000.0 must be at most 1000000000000");
}

TEST(Profile, ReaderChecksOefAndMakespanAgainstTheTimes) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["pairs"][0]["oef"] = 0.9;
  EXPECT_EQ(message_of(json),
            "p.json: /pairs/0/oef: 0.9 does not follow from the median times and makespan_us "
            "((T_a + T_b - makespan) / min(T_a, T_b) = 0.5)");
  json["pairs"][0]["oef"] = 1.5;
  EXPECT_EQ(message_of(json), "p.json: /pairs/0/oef: 1.5 must be at most 1");
  json["pairs"][0]["oef"] = 0.5;
  json["pairs"][0]["makespan_us"] = 24;
  EXPECT_EQ(message_of(json),
            "p.json: /pairs/0/makespan_us: 24 must equal max(finish_a_us, finish_b_us) = 25");
}

TEST(Profile, ReaderRefusesAnotherMajorVersion) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["schema_version"] = "2.0.0";
  try {
    profile_from_json(json, "p.json");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kSchemaVersion);
  }
}

TEST(Profile, ReaderRejectsUnorderedStatsAndDuplicateOps) {
  Json json = Json::parse(profile_to_text(small_profile()));
  json["ops"][1]["time_us"]["p10"] = 25.0;
  json["ops"].push_back(json["ops"][0]);
  EXPECT_EQ(message_of(json),
            "p.json: /ops/1/time_us: must satisfy min <= p10 <= median <= p90 <= max\n"
            "p.json: /ops/2/signature: \"gemm:bf16:m=8,n=8,k=8\" appears twice in /ops");
}

}  // namespace
}  // namespace dhelix
