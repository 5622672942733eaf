#include "runtime/train/token_data.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "lib/error.h"
#include "lib/input_file.h"

namespace dhelix::rt {
namespace {

// The most bytes a data file may hold: the whole file is loaded, as 4-byte tokens, into
// every rank's memory (a text file of 4 GiB takes 16 GiB per rank).
constexpr uint64_t kMaxDataBytes = uint64_t{4} << 30;

// errno is captured right after the failing call, before anything else can change it.
// Only regular files are read, up to kMaxDataBytes: a directory ended in an internal error
// (basic_filebuf::underflow), /dev/zero in a read that never ended.
std::string read_whole_file(const std::string& path, const char* what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int saved = errno;
    throw Error(ErrorCode::kIo,
                fmt::format("{}: cannot read {}: {}", path, what, std::strerror(saved)));
  }
  if (S_ISDIR(info.st_mode)) {
    throw Error(ErrorCode::kIo, fmt::format("{}: is a directory, expected a {}", path, what));
  }
  if (!S_ISREG(info.st_mode)) {
    throw Error(ErrorCode::kIo,
                fmt::format("{}: is not a regular file (a device or FIFO); dhelix-run reads a "
                            "{} whole and needs its size: copy the data into a file",
                            path, what));
  }
  if (static_cast<uint64_t>(info.st_size) > kMaxDataBytes) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: {} bytes is more than {} GiB, the most dhelix-run loads into "
                            "memory as training data",
                            path, info.st_size, kMaxDataBytes >> 30));
  }
  // The data-specific messages above first; then the shared reader, which opens without
  // waiting should a FIFO have taken the file's place meanwhile (lib/input_file.h).
  return read_input_file(path);
}

void reject_empty(const std::string& path, const std::string& bytes, const char* what) {
  if (!bytes.empty()) return;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: the {} is empty; training needs at least one sequence of tokens",
                          path, what));
}

// x * y mod m for 0 <= x, y < m without overflow: the product can exceed 2^63 when the
// token file holds more than ~3e9 tokens.
int64_t multiply_mod(int64_t x, int64_t y, int64_t m) {
  __extension__ using Uint128 = unsigned __int128;
  return static_cast<int64_t>(static_cast<Uint128>(x) * static_cast<Uint128>(y) %
                              static_cast<Uint128>(m));
}

}  // namespace

const char* token_width_name(TokenWidth width) {
  switch (width) {
    case TokenWidth::kUint16:
      return "uint16";
    case TokenWidth::kUint32:
      return "uint32";
  }
  return "?";
}

int64_t token_width_bytes(TokenWidth width) { return width == TokenWidth::kUint16 ? 2 : 4; }

TokenSource::TokenSource(std::vector<uint32_t> tokens, std::string name, int64_t bytes_per_token)
    : tokens_(std::move(tokens)), name_(std::move(name)), bytes_per_token_(bytes_per_token) {}

TokenSource TokenSource::from_text_file(const std::string& path) {
  const std::string bytes = read_whole_file(path, "text file");
  reject_empty(path, bytes, "text file");
  std::vector<uint32_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  return TokenSource(std::move(tokens), path, 1);
}

TokenSource TokenSource::from_token_file(const std::string& path, TokenWidth width) {
  const std::string bytes = read_whole_file(path, "token file");
  reject_empty(path, bytes, "token file");
  const int64_t width_bytes = token_width_bytes(width);
  const auto size_bytes = static_cast<int64_t>(bytes.size());
  if (size_bytes % width_bytes != 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: {} bytes is not a multiple of {} bytes, the size of one {} "
                            "token; the file is truncated or not a {} token file",
                            path, size_bytes, width_bytes, token_width_name(width),
                            token_width_name(width)));
  }
  // Decoded byte by byte: the file is little-endian whatever the host is.
  std::vector<uint32_t> tokens(static_cast<size_t>(size_bytes / width_bytes));
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t value = 0;
    for (int64_t b = width_bytes - 1; b >= 0; --b) {
      value = (value << 8) | data[i * static_cast<size_t>(width_bytes) + static_cast<size_t>(b)];
    }
    tokens[i] = value;
  }
  return TokenSource(std::move(tokens), path, width_bytes);
}

TokenSource TokenSource::from_tokens(std::vector<uint32_t> tokens, std::string name,
                                     int64_t bytes_per_token) {
  DHELIX_CHECK(bytes_per_token == 1 || bytes_per_token == 2 || bytes_per_token == 4);
  return TokenSource(std::move(tokens), std::move(name), bytes_per_token);
}

int64_t TokenSource::token(int64_t index) const {
  DHELIX_CHECK(index >= 0 && index < size());
  return tokens_[static_cast<size_t>(index)];
}

void TokenSource::check_vocab(int64_t vocab, const std::string& what) const {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] < vocab) continue;
    const auto index = static_cast<int64_t>(i);
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: token {} (byte offset {}): value {} is not below the "
                            "vocabulary size {} of {}",
                            name_, index, index * bytes_per_token_, tokens_[i], vocab, what));
  }
}

void TokenSource::check_sequence_length(int64_t seq_length) const {
  if (size() > seq_length) return;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: {} tokens are too few for one sequence of seq_length {} "
                          "(it needs seq_length + 1 = {} tokens: the inputs and the "
                          "targets shifted by one)",
                          name_, size(), seq_length, seq_length + 1));
}

int64_t sequence_index(int64_t step, int64_t dp_rank, int64_t dp, int64_t micro_batch,
                       int64_t num_micro_batches, int64_t micro_batch_size, int64_t row) {
  DHELIX_CHECK(step >= 0 && dp >= 1 && dp_rank >= 0 && dp_rank < dp);
  DHELIX_CHECK(num_micro_batches >= 1 && micro_batch >= 0 && micro_batch < num_micro_batches);
  DHELIX_CHECK(micro_batch_size >= 1 && row >= 0 && row < micro_batch_size);
  return ((step * dp + dp_rank) * num_micro_batches + micro_batch) * micro_batch_size + row;
}

int64_t sequence_start(int64_t index, int64_t seq_length, int64_t source_size) {
  DHELIX_CHECK(index >= 0 && seq_length >= 1 && source_size > seq_length);
  const int64_t windows = source_size - seq_length;
  return multiply_mod(index % windows, seq_length % windows, windows);
}

void fill_micro_batch(const TokenSource& source, int64_t step, int64_t dp_rank, int64_t dp,
                      int64_t micro_batch, int64_t num_micro_batches, int64_t micro_batch_size,
                      int64_t seq_length, std::vector<int32_t>& tokens,
                      std::vector<int32_t>& targets) {
  DHELIX_CHECK(seq_length >= 1 && micro_batch_size >= 1);
  source.check_sequence_length(seq_length);
  const auto total = static_cast<size_t>(micro_batch_size * seq_length);
  tokens.resize(total);
  targets.resize(total);
  for (int64_t row = 0; row < micro_batch_size; ++row) {
    const int64_t index =
        sequence_index(step, dp_rank, dp, micro_batch, num_micro_batches, micro_batch_size, row);
    const int64_t start = sequence_start(index, seq_length, source.size());
    for (int64_t t = 0; t <= seq_length; ++t) {
      const int64_t value = source.token(start + t);
      if (value > std::numeric_limits<int32_t>::max()) {
        throw Error(ErrorCode::kInvalidInput,
                    fmt::format("{}: token {}: value {} does not fit a 32-bit signed token id",
                                source.name(), start + t, value));
      }
      const auto position = static_cast<size_t>(row * seq_length + t);
      if (t < seq_length) tokens[position] = static_cast<int32_t>(value);
      if (t > 0) targets[position - 1] = static_cast<int32_t>(value);
    }
  }
}

}  // namespace dhelix::rt
