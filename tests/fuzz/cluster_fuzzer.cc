// libFuzzer target: cluster files (schemas/cluster.schema.json), presets and overrides.
#include "lib/cluster_reader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(data, size, [](const Json& json) {
    ProblemList problems;
    const ClusterSpec cluster = cluster_from_json(json, fuzz::kFuzzFileName, problems);
    problems.throw_if_any();
    (void)cluster_to_json(cluster).dump();
  });
}
