#pragma once
// Provenance: the `meta` block every output file carries, saying which tool (version and
// git hash) wrote it, from which command line and from which inputs (SHA-256 of each
// input file's bytes), on which host and when.
//
// With the environment variable DHELIX_DETERMINISTIC=1 the host name and date are left
// out, so that two runs on the same inputs write byte-identical files (golden tests).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/json_reader.h"

namespace dhelix {

/// SHA-256 (FIPS 180-4) of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

/// SHA-256 of a file's bytes; Error(kIo) naming the file when it cannot be read.
std::string sha256_file_hex(const std::string& path);

/// "dhelix-plan 0.1.0 (git 1a2b3c4d5e6f)": what --version prints.
std::string tool_version_text(const std::string& tool_name);

/// Whether DHELIX_DETERMINISTIC=1 asks for output without host name and date.
bool deterministic_output();

/// One input file and the hash of its bytes.
struct InputFile {
  std::string path;    ///< as the user named it
  std::string sha256;  ///< sha256_hex of its content
};

/// The `meta` block of an output file.
struct Provenance {
  std::string tool;      ///< "dhelix-plan"
  std::string version;   ///< DHELIX_VERSION
  std::string git_hash;  ///< DHELIX_GIT_HASH ("unknown" outside a git checkout)
  std::vector<std::string> argv;
  std::vector<InputFile> inputs;
  std::string host;      ///< "" when deterministic
  std::string date_utc;  ///< ISO 8601, "2025-01-31T12:00:00Z"; "" when deterministic
};

/// Provenance of this run: hashes every file of `input_paths` (duplicates and "" skipped)
/// and, unless deterministic_output(), records host name and the current UTC time.
Provenance make_provenance(const std::string& tool_name, const std::vector<std::string>& argv,
                           const std::vector<std::string>& input_paths);

/// The `meta` JSON object; host and date are omitted when empty.
OrderedJson provenance_to_json(const Provenance& provenance);

}  // namespace dhelix
