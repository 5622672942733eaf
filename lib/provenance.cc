#include "lib/provenance.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "dhelix_version.h"
#include "lib/input_file.h"

namespace dhelix {
namespace {

// SHA-256 as FIPS 180-4 section 6.2 describes it: the message is padded to a multiple
// of 512 bits (a 1 bit, zeros, the 64-bit big-endian bit length) and each 512-bit block
// runs 64 rounds over eight 32-bit working variables.
constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::array<uint32_t, 8> kInitialHash = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress(std::array<uint32_t, 8>& hash, const unsigned char* block) {
  std::array<uint32_t, 64> w{};
  for (int t = 0; t < 16; ++t) {
    w[t] = (uint32_t{block[4 * t]} << 24) | (uint32_t{block[4 * t + 1]} << 16) |
           (uint32_t{block[4 * t + 2]} << 8) | uint32_t{block[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = hash[0], b = hash[1], c = hash[2], d = hash[3];
  uint32_t e = hash[4], f = hash[5], g = hash[6], h = hash[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t sum1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + sum1 + choose + kRoundConstants[t] + w[t];
    const uint32_t sum0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  hash[0] += a;
  hash[1] += b;
  hash[2] += c;
  hash[3] += d;
  hash[4] += e;
  hash[5] += f;
  hash[6] += g;
  hash[7] += h;
}

std::string utc_now_text() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::array<uint32_t, 8> hash = kInitialHash;
  const size_t full_blocks = bytes.size() / 64;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < full_blocks; ++i) compress(hash, data + 64 * i);

  // Padding: the tail, a 0x80 byte, zeros, then the length in bits; one or two blocks.
  std::array<unsigned char, 128> tail{};
  const size_t tail_size = bytes.size() - 64 * full_blocks;
  std::copy(data + 64 * full_blocks, data + bytes.size(), tail.begin());
  tail[tail_size] = 0x80;
  const size_t tail_blocks = tail_size + 1 + 8 <= 64 ? 1 : 2;
  const uint64_t bit_length = static_cast<uint64_t>(bytes.size()) * 8;
  for (int i = 0; i < 8; ++i) {
    tail[64 * tail_blocks - 1 - i] = static_cast<unsigned char>(bit_length >> (8 * i));
  }
  for (size_t i = 0; i < tail_blocks; ++i) compress(hash, tail.data() + 64 * i);

  std::string hex;
  for (uint32_t word : hash) hex += fmt::format("{:08x}", word);
  return hex;
}

std::string sha256_file_hex(const std::string& path) {
  // The same reader as the input itself (lib/input_file.h): never a FIFO or a device.
  return sha256_hex(read_input_file(path));
}

std::string tool_version_text(const std::string& tool_name) {
  return fmt::format("{} {} (git {})", tool_name, DHELIX_VERSION, DHELIX_GIT_HASH);
}

bool deterministic_output() {
  const char* value = std::getenv("DHELIX_DETERMINISTIC");
  return value != nullptr && std::string_view(value) == "1";
}

Provenance make_provenance(const std::string& tool_name, const std::vector<std::string>& argv,
                           const std::vector<std::string>& input_paths) {
  Provenance provenance;
  provenance.tool = tool_name;
  provenance.version = DHELIX_VERSION;
  provenance.git_hash = DHELIX_GIT_HASH;
  provenance.argv = argv;
  for (const std::string& path : input_paths) {
    if (path.empty()) continue;
    const bool seen = std::any_of(provenance.inputs.begin(), provenance.inputs.end(),
                                  [&path](const InputFile& input) { return input.path == path; });
    if (!seen) provenance.inputs.push_back({path, sha256_file_hex(path)});
  }
  if (!deterministic_output()) {
    provenance.host = host_name();
    provenance.date_utc = utc_now_text();
  }
  return provenance;
}

OrderedJson provenance_to_json(const Provenance& provenance) {
  OrderedJson json;
  json["tool"] = provenance.tool;
  json["version"] = provenance.version;
  json["git_hash"] = provenance.git_hash;
  json["argv"] = provenance.argv;
  OrderedJson inputs = OrderedJson::array();
  for (const InputFile& input : provenance.inputs) {
    inputs.push_back(OrderedJson{{"path", input.path}, {"sha256", input.sha256}});
  }
  json["inputs"] = inputs;
  if (!provenance.host.empty()) json["host"] = provenance.host;
  if (!provenance.date_utc.empty()) json["date_utc"] = provenance.date_utc;
  return json;
}

}  // namespace dhelix
