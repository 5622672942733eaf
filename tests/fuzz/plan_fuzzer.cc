// libFuzzer target: plan files (lib/plan/plan_reader.h), as dhelix-run and dhelix-diff read them.
#include "lib/plan/plan_reader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(
      data, size, [](const Json& json) { (void)plan_from_json(json, fuzz::kFuzzFileName); });
}
