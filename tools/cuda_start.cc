#include "tools/cuda_start.h"

#include <string_view>

namespace dhelix {

bool command_line_asks_for_cuda(int argc, const char* const* argv) {
  constexpr std::string_view kFlag = "--backend";
  bool cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--") break;
    if (argument == kFlag && i + 1 < argc) {
      cuda = std::string_view(argv[++i]) == "cuda";
    } else if (argument.starts_with(kFlag) && argument.size() > kFlag.size() &&
               argument[kFlag.size()] == '=') {
      cuda = argument.substr(kFlag.size() + 1) == "cuda";
    }
  }
  return cuda;
}

}  // namespace dhelix
