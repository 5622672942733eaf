// libFuzzer target: HuggingFace config.json import (lib/hf_config_reader.h).
#include "lib/hf_config_reader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(data, size, [](const Json& json) {
    ProblemList problems;
    const ModelSpec model = model_from_hf_config(json, fuzz::kFuzzFileName, problems);
    problems.throw_if_any();
    (void)model_to_json(model).dump();
  });
}
