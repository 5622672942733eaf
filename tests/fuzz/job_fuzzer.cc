// libFuzzer target: job files (lib/job_reader.h) and then job validation, as dhelix-plan
// reads a job. A job names its model and cluster by path relative to the job file, so the
// fuzzed job is read as if it sat in a scratch folder holding a valid "model.json" (Llama
// 8B) and "cluster.json" (A40); inline model and cluster objects are fuzzed directly.

#include <unistd.h>

#include <filesystem>
#include <string>

#include "lib/job_reader.h"
#include "lib/job_validation.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

namespace fs = std::filesystem;

// The scratch folder, made once per process and removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "dhelix-job-fuzz.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) __builtin_trap();
    path_ = pattern;
    const fs::path examples = fs::path(DHELIX_SOURCE_DIR) / "examples";
    fs::copy_file(examples / "models" / "llama-8b.json", fs::path(path_) / "model.json");
    fs::copy_file(examples / "clusters" / "a40.json", fs::path(path_) / "cluster.json");
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string& scratch_dir() {
  static const ScratchDir dir;
  return dir.path();
}

// Paths out of the scratch folder would let the fuzzer read the machine's files (/dev/zero
// never ends); the reader's own handling of a missing or odd path is still exercised.
bool stays_in_scratch(const dhelix::Json& json, const char* key) {
  if (!json.is_object()) return true;
  const auto it = json.find(key);
  if (it == json.end() || !it->is_string()) return true;
  const std::string& path = it->get_ref<const std::string&>();
  return !path.starts_with("/") && path.find("..") == std::string::npos &&
         path.find('~') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  (void)scratch_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(data, size, [](const Json& json) {
    if (!stays_in_scratch(json, "model") || !stays_in_scratch(json, "cluster")) return;
    ProblemList problems;
    const JobSpec job = job_from_json(json, fuzz::kFuzzFileName, scratch_dir(), problems);
    problems.throw_if_any();
    // dhelix-plan validates every job it reads before planning: fuzz those rules too.
    validate_job(job).throw_if_any();
    (void)job_warnings(job);
  });
}
