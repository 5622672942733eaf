// libFuzzer target: profile files (lib/profile.h), as dhelix-plan --profile reads them.
#include "lib/profile.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dhelix;
  return fuzz::read_fuzzed_json(data, size, [](const Json& json) {
    const Profile profile = profile_from_json(json, fuzz::kFuzzFileName);
    (void)profile_to_json(profile).dump();
  });
}
