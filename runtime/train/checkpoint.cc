// The rank shard binary format (see checkpoint.h for the layout). The manifest and the
// commit protocol are in checkpoint_commit.cc.

#include "runtime/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/error.h"

namespace dhelix::rt {
namespace {

constexpr std::string_view kMagic("DHXCKPT\0", 8);
constexpr int64_t kMaxNameBytes = 65535;
constexpr size_t kPlanHashDigits = 64;
// magic, version, zero, rank, step, data_position, rng_state; the identity (world size,
// five coordinates, plan hash, run id); tensor count.
constexpr int64_t kHeaderBytes = 8 + 4 + 4 + 8 * 4 + 8 * 6 + kPlanHashDigits + kRunIdDigits + 8;
constexpr int64_t kChecksumBytes = 8;

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

// Little-endian whatever the host: integers byte by byte.
void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_floats(std::string& out, const float* values, int64_t count) {
  if constexpr (std::endian::native == std::endian::little) {
    out.append(reinterpret_cast<const char*>(values), static_cast<size_t>(count) * 4);
  } else {
    for (int64_t i = 0; i < count; ++i) put_u32(out, std::bit_cast<uint32_t>(values[i]));
  }
}

// Reads the shard front to back; every read first checks that the bytes exist, so a
// corrupt size can only produce an error, never a read past the end or a huge allocation.
class ShardCursor {
 public:
  ShardCursor(const std::string& path, const std::string& bytes) : path_(path), bytes_(bytes) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::kInvalidInput, fmt::format("{}: {}", path_, what));
  }
  void need(uint64_t count, const std::string& what) const {
    if (count <= remaining()) return;
    fail(
        fmt::format("truncated: reading {} at offset {} needs {} bytes, but the file has only "
                    "{} bytes",
                    what, position_, count, bytes_.size()));
  }
  uint64_t remaining() const { return bytes_.size() - position_; }
  size_t position() const { return position_; }

  uint64_t u64(const std::string& what) {
    need(8, what);
    uint64_t value = 0;
    for (int i = 7; i >= 0; --i) value = (value << 8) | byte_at(position_ + static_cast<size_t>(i));
    position_ += 8;
    return value;
  }
  uint32_t u32(const std::string& what) {
    need(4, what);
    uint32_t value = 0;
    for (int i = 3; i >= 0; --i) value = (value << 8) | byte_at(position_ + static_cast<size_t>(i));
    position_ += 4;
    return value;
  }
  std::string text(uint64_t count, const std::string& what) {
    need(count, what);
    std::string value = bytes_.substr(position_, count);
    position_ += count;
    return value;
  }
  std::vector<float> floats(uint64_t count, const std::string& what) {
    // count * 4 may wrap around, so the check divides instead.
    if (count > remaining() / 4) {
      fail(
          fmt::format("truncated: reading {} at offset {} needs {} floats of 4 bytes, but the "
                      "file has only {} bytes",
                      what, position_, count, bytes_.size()));
    }
    std::vector<float> values(count);
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(values.data(), bytes_.data() + position_, count * 4);
      position_ += count * 4;
    } else {
      for (float& value : values) value = std::bit_cast<float>(u32(what));
    }
    return values;
  }

 private:
  uint32_t byte_at(size_t i) const { return static_cast<unsigned char>(bytes_[i]); }

  const std::string& path_;
  const std::string& bytes_;
  size_t position_ = 0;
};

void check_magic_and_version(ShardCursor& cursor, const std::string& bytes) {
  if (bytes.empty()) cursor.fail("the file is empty, it is not a checkpoint shard");
  const std::string_view head(bytes.data(), std::min(bytes.size(), kMagic.size()));
  if (head != kMagic.substr(0, head.size())) {
    cursor.fail(
        fmt::format("not a dhelix checkpoint shard: it does not start with the magic "
                    "bytes \"DHXCKPT\\0\""));
  }
  cursor.need(kMagic.size(), "the magic bytes");
  cursor.text(kMagic.size(), "the magic bytes");
  const uint32_t version = cursor.u32("the format version");
  if (version != kShardFormatVersion) {
    cursor.fail(fmt::format("shard format version {}; this dhelix reads version {}{}", version,
                            kShardFormatVersion,
                            version == 1 ? " (version 1 shards carry no run identity: train "
                                           "again from step 0 or resume with the dhelix that "
                                           "wrote them)"
                                         : ""));
  }
  if (cursor.u32("the reserved field") != 0) cursor.fail("the reserved header field is not 0");
}

void put_identity(std::string& out, const ShardIdentity& identity) {
  DHELIX_CHECK(is_lower_hex(identity.plan_sha256, kPlanHashDigits));
  DHELIX_CHECK(is_lower_hex(identity.run_id, kRunIdDigits));
  const RankCoordinates& c = identity.coordinates;
  for (const int64_t value : {identity.world_size, c.pp, c.tp, c.cp, c.ep, c.dp}) {
    put_u64(out, static_cast<uint64_t>(value));
  }
  out.append(identity.plan_sha256);
  out.append(identity.run_id);
}

ShardIdentity read_identity(ShardCursor& cursor, int64_t rank) {
  ShardIdentity identity;
  RankCoordinates& c = identity.coordinates;
  identity.world_size = static_cast<int64_t>(cursor.u64("the world size"));
  int64_t* const fields[] = {&c.pp, &c.tp, &c.cp, &c.ep, &c.dp};
  const char* const names[] = {"pp", "tp", "cp", "ep", "dp"};
  for (size_t i = 0; i < 5; ++i) {
    *fields[i] = static_cast<int64_t>(cursor.u64(fmt::format("the {} coordinate", names[i])));
    if (*fields[i] < 0) cursor.fail(fmt::format("corrupt: negative {} coordinate", names[i]));
  }
  if (identity.world_size < 1 || rank >= identity.world_size) {
    cursor.fail(fmt::format("corrupt: rank {} of a world of {} ranks", rank, identity.world_size));
  }
  identity.plan_sha256 = cursor.text(kPlanHashDigits, "the plan hash");
  if (!is_lower_hex(identity.plan_sha256, kPlanHashDigits)) {
    cursor.fail("corrupt: the plan hash is not 64 lowercase hexadecimal digits");
  }
  identity.run_id = cursor.text(kRunIdDigits, "the run id");
  if (!is_lower_hex(identity.run_id, kRunIdDigits)) {
    cursor.fail(
        fmt::format("corrupt: the run id is not {} lowercase hexadecimal digits", kRunIdDigits));
  }
  return identity;
}

const char* file_type_text(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

NamedTensor read_tensor(ShardCursor& cursor, uint64_t index, std::set<std::string>& names) {
  const std::string which = fmt::format("tensor {}", index);
  const uint32_t name_bytes = cursor.u32(which + " name length");
  if (name_bytes > kMaxNameBytes) {
    cursor.fail(fmt::format("corrupt: {} has a name of {} bytes, more than the {} allowed", which,
                            name_bytes, kMaxNameBytes));
  }
  NamedTensor tensor;
  tensor.name = cursor.text(name_bytes, which + " name");
  const std::string named = fmt::format("tensor {} \"{}\"", index, tensor.name);
  if (!names.insert(tensor.name).second) {
    cursor.fail(fmt::format("corrupt: {} repeats the name of an earlier tensor", named));
  }
  const uint64_t count = cursor.u64(named + " value count");
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    cursor.fail(fmt::format("corrupt: {} has a negative value count", named));
  }
  tensor.values = cursor.floats(count, named + " values");
  return tensor;
}

}  // namespace

const NamedTensor* RankShard::find(const std::string& name) const {
  for (const NamedTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

void RankShard::copy_into(const std::string& name, float* values, int64_t count) const {
  const NamedTensor* tensor = find(name);
  if (tensor == nullptr) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: the checkpoint has no tensor \"{}\"", file, name));
  }
  if (static_cast<int64_t>(tensor->values.size()) != count) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: tensor \"{}\" has {} values, the model expects {}", file, name,
                            tensor->values.size(), count));
  }
  std::copy(tensor->values.begin(), tensor->values.end(), values);
}

bool is_lower_hex(const std::string& text, size_t digits) {
  return text.size() == digits && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string read_checkpoint_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int saved = errno;
    throw Error(ErrorCode::kIo,
                fmt::format("{}: cannot read {}: {}", path, what, std::strerror(saved)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const mode_t mode = info.st_mode;
    ::close(fd);
    throw Error(ErrorCode::kIo, fmt::format("{}: is {}, not a file: a {} must be a regular file",
                                            path, file_type_text(mode), what));
  }
  std::string bytes;
  bytes.reserve(static_cast<size_t>(info.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: cannot read {}: {}", path, what, std::strerror(saved)));
    }
    bytes.append(chunk, static_cast<size_t>(got));
  }
  ::close(fd);
  return bytes;
}

std::string rank_shard_file_name(int64_t rank) { return fmt::format("rank-{}.bin", rank); }

int64_t rank_shard_bytes(const RankShardView& shard) {
  int64_t bytes = kHeaderBytes + kChecksumBytes;
  for (const TensorView& tensor : shard.tensors) {
    bytes += 4 + static_cast<int64_t>(tensor.name.size()) + 8 + 4 * tensor.count;
  }
  return bytes;
}

int64_t write_rank_shard(const std::string& step_dir, const RankShardView& shard) {
  std::string out;
  out.reserve(static_cast<size_t>(rank_shard_bytes(shard)));
  out.append(kMagic);
  put_u32(out, kShardFormatVersion);
  put_u32(out, 0);
  put_u64(out, static_cast<uint64_t>(shard.rank));
  put_u64(out, static_cast<uint64_t>(shard.step));
  put_u64(out, shard.data_position);
  put_u64(out, shard.rng_state);
  put_identity(out, shard.identity);
  put_u64(out, shard.tensors.size());
  std::set<std::string> names;
  for (const TensorView& tensor : shard.tensors) {
    DHELIX_CHECK_MSG(names.insert(tensor.name).second, "duplicate tensor " + tensor.name);
    DHELIX_CHECK(static_cast<int64_t>(tensor.name.size()) <= kMaxNameBytes);
    DHELIX_CHECK(tensor.count >= 0 && (tensor.count == 0 || tensor.values != nullptr));
    put_u32(out, static_cast<uint32_t>(tensor.name.size()));
    out.append(tensor.name);
    put_u64(out, static_cast<uint64_t>(tensor.count));
    put_floats(out, tensor.values, tensor.count);
  }
  put_u64(out, fnv1a64(out));
  DHELIX_CHECK(static_cast<int64_t>(out.size()) == rank_shard_bytes(shard));
  write_file_atomically(step_dir + "/" + rank_shard_file_name(shard.rank), out);
  return static_cast<int64_t>(out.size());
}

RankShard read_rank_shard(const std::string& path) {
  const std::string bytes = read_checkpoint_file(path, "checkpoint shard");
  ShardCursor cursor(path, bytes);
  check_magic_and_version(cursor, bytes);
  RankShard shard;
  shard.file = path;
  shard.rank = static_cast<int64_t>(cursor.u64("the rank"));
  shard.step = static_cast<int64_t>(cursor.u64("the step"));
  shard.data_position = cursor.u64("the data position");
  shard.rng_state = cursor.u64("the RNG state");
  if (shard.rank < 0 || shard.step < 0) {
    cursor.fail(fmt::format("corrupt: negative rank {} or step {}", shard.rank, shard.step));
  }
  shard.identity = read_identity(cursor, shard.rank);
  const uint64_t count = cursor.u64("the tensor count");
  // Every tensor takes at least 12 bytes (name length and value count).
  if (count > cursor.remaining() / 12) {
    cursor.fail(fmt::format("truncated or corrupt: {} tensors cannot fit in the {} bytes left",
                            count, cursor.remaining()));
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) shard.tensors.push_back(read_tensor(cursor, i, names));
  const size_t body_bytes = cursor.position();
  const uint64_t stored = cursor.u64("the checksum");
  if (cursor.remaining() != 0) {
    cursor.fail(
        fmt::format("corrupt: the file has {} bytes, {} more than its tensors and "
                    "checksum take",
                    bytes.size(), cursor.remaining()));
  }
  const uint64_t computed = fnv1a64(std::string_view(bytes.data(), body_bytes));
  if (stored != computed) {
    cursor.fail(
        fmt::format("checksum mismatch: the file stores {:#018x} but its bytes hash to "
                    "{:#018x}; the shard is corrupt",
                    stored, computed));
  }
  return shard;
}

}  // namespace dhelix::rt
