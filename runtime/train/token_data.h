#pragma once
// Training data: a stream of token ids read whole into memory, and the deterministic
// sampler that cuts it into the micro-batches of every step.
//
// Two sources: a text file read byte by byte (byte-level tokens 0..255, vocabulary 256;
// examples/data/corpus.txt), and a flat binary file of little-endian uint16 or uint32
// token ids, the usual output of a tokenizer run over a real corpus.
//
// The sampler is a pure function of (step, data-parallel rank, micro-batch, row), so a
// resumed run reads exactly the tokens the interrupted run would have read, and every
// TP rank of a stage computes the same micro-batch without talking to the others.
// Sequence s starts at token offset (s * seq_length) mod (size - seq_length) and takes
// seq_length + 1 consecutive tokens: the first seq_length are the inputs, the last
// seq_length (shifted by one) the targets. Worked example, size = 10, seq_length = 3:
// there are 10 - 3 = 7 start offsets (0..6, the last window reads tokens 6..9);
// sequences 0, 1, 2 start at 0, 3, 6, and sequence 3 wraps to (9 mod 7) = 2.

#include <cstdint>
#include <string>
#include <vector>

namespace dhelix::rt {

/// Width of one token id in a binary token file.
enum class TokenWidth { kUint16, kUint32 };

/// "uint16", "uint32": the names used in flags and messages.
const char* token_width_name(TokenWidth width);

/// Bytes per token id: 2 or 4.
int64_t token_width_bytes(TokenWidth width);

/// Vocabulary size of byte-level text tokens.
inline constexpr int64_t kByteVocabSize = 256;

/// A sequence of token ids held in memory, with the file it came from for messages.
class TokenSource {
 public:
  /// Every byte of the file is one token (0..255). Error(kIo) naming the file when it
  /// cannot be read; Error(kInvalidInput) when it is empty.
  static TokenSource from_text_file(const std::string& path);

  /// A flat array of little-endian token ids. Error(kIo) when the file cannot be read;
  /// Error(kInvalidInput) when it is empty or its size is not a multiple of the width.
  static TokenSource from_token_file(const std::string& path, TokenWidth width);

  /// Tokens already in memory (tests, generated data); `name` stands for the file in
  /// messages and `bytes_per_token` (1, 2 or 4) turns an index into a byte offset there.
  static TokenSource from_tokens(std::vector<uint32_t> tokens, std::string name,
                                 int64_t bytes_per_token = 4);

  /// Number of tokens.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  /// Token `index` (0 <= index < size()).
  int64_t token(int64_t index) const;

  /// The file name as given, for messages.
  const std::string& name() const { return name_; }

  /// Bytes per token in the file: 1 for text, 2 or 4 for token files.
  int64_t bytes_per_token() const { return bytes_per_token_; }

  /// Throws Error(kInvalidInput) naming the file, the first bad token's index and byte
  /// offset, its value and the vocabulary when a token is >= `vocab`; `what` says where
  /// the vocabulary size comes from ("model.json: /vocab_size").
  void check_vocab(int64_t vocab, const std::string& what) const;

  /// Throws Error(kInvalidInput) when the source holds fewer than seq_length + 1 tokens,
  /// the least one sequence (inputs plus the shifted targets) needs.
  void check_sequence_length(int64_t seq_length) const;

 private:
  TokenSource(std::vector<uint32_t> tokens, std::string name, int64_t bytes_per_token);

  std::vector<uint32_t> tokens_;
  std::string name_;
  int64_t bytes_per_token_ = 1;
};

/// Global index of row `row` of micro-batch `micro_batch` of data-parallel rank `dp_rank`
/// at training step `step` (0-based):
///   ((step * dp + dp_rank) * num_micro_batches + micro_batch) * micro_batch_size + row.
int64_t sequence_index(int64_t step, int64_t dp_rank, int64_t dp, int64_t micro_batch,
                       int64_t num_micro_batches, int64_t micro_batch_size, int64_t row);

/// First token of sequence `index`: (index * seq_length) mod (source_size - seq_length),
/// computed without overflow. Requires source_size > seq_length >= 1 and index >= 0.
int64_t sequence_start(int64_t index, int64_t seq_length, int64_t source_size);

/// Fills one micro-batch: `tokens` and `targets` get micro_batch_size * seq_length ids,
/// row-major; row b is sequence sequence_index(..., b), inputs from its start offset and
/// targets one token later. Throws Error(kInvalidInput) when the source is too short for
/// one sequence (check_sequence_length) or a token does not fit an int32; call
/// check_vocab once before training. Arguments out of range (dp_rank >= dp, ...) are
/// caller bugs and abort.
void fill_micro_batch(const TokenSource& source, int64_t step, int64_t dp_rank, int64_t dp,
                      int64_t micro_batch, int64_t num_micro_batches, int64_t micro_batch_size,
                      int64_t seq_length, std::vector<int32_t>& tokens,
                      std::vector<int32_t>& targets);

}  // namespace dhelix::rt
