// Token sources (text bytes, little-endian uint16/uint32 files), their errors, and the
// deterministic micro-batch sampler against hand-computed offsets.

#include "runtime/train/token_data.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/error.h"
#include "tests/runtime/error_of.h"
#include "tests/runtime/scratch_dir.h"

namespace dhelix::rt {
namespace {

namespace fs = std::filesystem;

class TokenDataTest : public ::testing::Test {
 protected:
  test::ScratchDir scratch_{"dhelix-token-"};
  std::string dir_ = scratch_.path();

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

using test::error_of;

TokenSource counting_source(int64_t size) {
  std::vector<uint32_t> tokens(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i)
    tokens[static_cast<size_t>(i)] = 100 + static_cast<uint32_t>(i);
  return TokenSource::from_tokens(std::move(tokens), "counting");
}

TEST_F(TokenDataTest, TextFileGivesOneTokenPerByte) {
  const std::string path = write("text.txt", std::string("Hi\n\xff", 4));
  const TokenSource source = TokenSource::from_text_file(path);
  ASSERT_EQ(source.size(), 4);
  EXPECT_EQ(source.token(0), 72);
  EXPECT_EQ(source.token(1), 105);
  EXPECT_EQ(source.token(2), 10);
  EXPECT_EQ(source.token(3), 255);
  EXPECT_EQ(source.bytes_per_token(), 1);
  EXPECT_EQ(source.name(), path);
  source.check_vocab(kByteVocabSize, "byte-level text");
}

TEST_F(TokenDataTest, Uint16FileIsLittleEndian) {
  const std::string path = write("t16.bin", std::string("\x34\x12\xff\xff\x00\x01", 6));
  const TokenSource source = TokenSource::from_token_file(path, TokenWidth::kUint16);
  ASSERT_EQ(source.size(), 3);
  EXPECT_EQ(source.token(0), 0x1234);
  EXPECT_EQ(source.token(1), 65535);
  EXPECT_EQ(source.token(2), 256);
  EXPECT_EQ(source.bytes_per_token(), 2);
}

TEST_F(TokenDataTest, Uint32FileIsLittleEndian) {
  const std::string path = write("t32.bin", std::string("\x78\x56\x34\x12\x01\x00\x00\x00", 8));
  const TokenSource source = TokenSource::from_token_file(path, TokenWidth::kUint32);
  ASSERT_EQ(source.size(), 2);
  EXPECT_EQ(source.token(0), 0x12345678);
  EXPECT_EQ(source.token(1), 1);
}

TEST_F(TokenDataTest, SizeNotAMultipleOfTheWidthIsRefused) {
  const std::string path = write("odd.bin", std::string("\x01\x00\x02\x00\x03", 5));
  const auto [code, message] =
      error_of([&] { TokenSource::from_token_file(path, TokenWidth::kUint16); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message, path +
                         ": 5 bytes is not a multiple of 2 bytes, the size of one uint16 token; "
                         "the file is truncated or not a uint16 token file");
  const std::string path32 = write("six.bin", std::string(6, '\0'));
  EXPECT_EQ(error_of([&] { TokenSource::from_token_file(path32, TokenWidth::kUint32); }).second,
            path32 +
                ": 6 bytes is not a multiple of 4 bytes, the size of one uint32 token; "
                "the file is truncated or not a uint32 token file");
}

TEST_F(TokenDataTest, TokenAtOrAboveTheVocabularyIsNamedWithItsOffset) {
  // uint16 tokens 1, 255, 256, 300: the first bad one is index 2, byte offset 4.
  const std::string path = write("big.bin", std::string("\x01\x00\xff\x00\x00\x01\x2c\x01", 8));
  const TokenSource source = TokenSource::from_token_file(path, TokenWidth::kUint16);
  const auto [code, message] =
      error_of([&] { source.check_vocab(256, "model.json: /vocab_size"); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message, path +
                         ": token 2 (byte offset 4): value 256 is not below the vocabulary "
                         "size 256 of model.json: /vocab_size");
  source.check_vocab(301, "model.json: /vocab_size");
}

TEST_F(TokenDataTest, MissingAndEmptyFilesAreRefused) {
  const std::string missing = dir_ + "/missing.bin";
  const auto [code, message] =
      error_of([&] { TokenSource::from_token_file(missing, TokenWidth::kUint32); });
  EXPECT_EQ(code, ErrorCode::kIo);
  EXPECT_EQ(message, missing + ": cannot read token file: No such file or directory");
  EXPECT_EQ(error_of([&] { TokenSource::from_text_file(missing); }).second,
            missing + ": cannot read text file: No such file or directory");

  const std::string empty = write("empty.txt", "");
  const auto [empty_code, empty_message] = error_of([&] { TokenSource::from_text_file(empty); });
  EXPECT_EQ(empty_code, ErrorCode::kInvalidInput);
  EXPECT_EQ(empty_message,
            empty + ": the text file is empty; training needs at least one sequence of tokens");
}

// A directory ended in an internal error (basic_filebuf::underflow) and MPI_ABORT;
// /dev/zero in a read that never ended.
TEST_F(TokenDataTest, DirectoriesAndDevicesAreRefused) {
  const auto [dir_code, dir_message] = error_of([&] { TokenSource::from_text_file(dir_); });
  EXPECT_EQ(dir_code, ErrorCode::kIo);
  EXPECT_EQ(dir_message, dir_ + ": is a directory, expected a text file");
  const auto [zero_code, zero_message] =
      error_of([&] { TokenSource::from_token_file("/dev/zero", TokenWidth::kUint16); });
  EXPECT_EQ(zero_code, ErrorCode::kIo);
  EXPECT_EQ(zero_message,
            "/dev/zero: is not a regular file (a device or FIFO); dhelix-run reads a token file "
            "whole and needs its size: copy the data into a file");
}

TEST_F(TokenDataTest, SourceTooShortForOneSequenceIsRefused) {
  const TokenSource source = counting_source(4);
  std::vector<int32_t> tokens, targets;
  const auto [code, message] =
      error_of([&] { fill_micro_batch(source, 0, 0, 1, 0, 1, 1, 4, tokens, targets); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_EQ(message,
            "counting: 4 tokens are too few for one sequence of seq_length 4 (it needs "
            "seq_length + 1 = 5 tokens: the inputs and the targets shifted by one)");
  // Exactly seq_length + 1 tokens is one window, read by every sequence.
  fill_micro_batch(counting_source(5), 3, 0, 1, 0, 1, 2, 4, tokens, targets);
  EXPECT_EQ(tokens, (std::vector<int32_t>{100, 101, 102, 103, 100, 101, 102, 103}));
  EXPECT_EQ(targets, (std::vector<int32_t>{101, 102, 103, 104, 101, 102, 103, 104}));
}

TEST(TokenSampler, SequenceIndexFollowsStepRankMicroBatchRow) {
  // dp = 2, 2 micro-batches of 2 rows: ((1 * 2 + 1) * 2 + 1) * 2 + 1 = 15.
  EXPECT_EQ(sequence_index(1, 1, 2, 1, 2, 2, 1), 15);
  EXPECT_EQ(sequence_index(0, 0, 2, 0, 2, 2, 0), 0);
  // One step of all ranks covers dp * num_micro_batches * micro_batch_size = 8 sequences.
  EXPECT_EQ(sequence_index(1, 0, 2, 0, 2, 2, 0), 8);
}

TEST(TokenSampler, StartOffsetsWrapAroundTheWindows) {
  // size 10, seq_length 3: 7 start offsets 0..6.
  EXPECT_EQ(sequence_start(0, 3, 10), 0);
  EXPECT_EQ(sequence_start(2, 3, 10), 6);
  EXPECT_EQ(sequence_start(3, 3, 10), 2);   // 9 mod 7
  EXPECT_EQ(sequence_start(14, 3, 10), 0);  // 42 mod 7
  // 2^62 * 3 overflows int64; 2^62 mod 1000003 = 837674, times 3 mod 1000003 = 513016.
  EXPECT_EQ(sequence_start(int64_t{1} << 62, 3, 1000006), 513016);
}

TEST(TokenSampler, FillsTheHandComputedMicroBatch) {
  // Tokens 100..109 (token i = 100 + i), seq_length 3, dp 2, 2 micro-batches of 2 rows.
  const TokenSource source = counting_source(10);
  std::vector<int32_t> tokens, targets;
  // Step 0, rank 0, micro-batch 1: sequences 2 and 3 start at 6 (the last window, ending
  // on the last token) and at 9 mod 7 = 2.
  fill_micro_batch(source, 0, 0, 2, 1, 2, 2, 3, tokens, targets);
  EXPECT_EQ(tokens, (std::vector<int32_t>{106, 107, 108, 102, 103, 104}));
  EXPECT_EQ(targets, (std::vector<int32_t>{107, 108, 109, 103, 104, 105}));
  // Step 1, rank 1, micro-batch 1: sequences 14 and 15 start at 42 mod 7 = 0, 45 mod 7 = 3.
  fill_micro_batch(source, 1, 1, 2, 1, 2, 2, 3, tokens, targets);
  EXPECT_EQ(tokens, (std::vector<int32_t>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(targets, (std::vector<int32_t>{101, 102, 103, 104, 105, 106}));
}

TEST(TokenSampler, SameArgumentsGiveTheSameTokens) {
  const TokenSource source = counting_source(1000);
  std::vector<int32_t> first_tokens, first_targets, again_tokens, again_targets;
  fill_micro_batch(source, 7, 1, 4, 2, 3, 4, 16, first_tokens, first_targets);
  fill_micro_batch(source, 7, 1, 4, 2, 3, 4, 16, again_tokens, again_targets);
  EXPECT_EQ(first_tokens, again_tokens);
  EXPECT_EQ(first_targets, again_targets);
  // Another data-parallel rank reads other sequences.
  fill_micro_batch(source, 7, 2, 4, 2, 3, 4, 16, again_tokens, again_targets);
  EXPECT_NE(first_tokens, again_tokens);
}

TEST(TokenSampler, ShippedCorpusIsPlainTextOfTheAdvertisedSize) {
  const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/data/corpus.txt";
  const TokenSource source = TokenSource::from_text_file(path);
  EXPECT_GE(source.size(), 40 * 1024);
  EXPECT_LE(source.size(), 80 * 1024);
  // Printable ASCII and newlines only, so that every byte token is a character.
  for (int64_t i = 0; i < source.size(); ++i) {
    const int64_t value = source.token(i);
    ASSERT_TRUE(value == '\n' || (value >= 32 && value < 127)) << "byte " << i << " = " << value;
  }
}

}  // namespace
}  // namespace dhelix::rt
