// libFuzzer target: dhelix's own model JSON (schemas/model.schema.json).
#include "lib/model_reader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(data, size, [](const Json& json) {
    ProblemList problems;
    const ModelSpec model = model_from_json(json, fuzz::kFuzzFileName, problems);
    problems.throw_if_any();
    // An accepted model must write back out (provenance does this for every plan).
    (void)model_to_json(model).dump();
  });
}
