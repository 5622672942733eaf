// dhelix-run: Runs a plan on CPU or GPU ranks.
// Only --help and --version work so far: this version plans but does not train yet.

#include "lib/error.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  return dhelix::run_tool("dhelix-run", argc, argv, [](CLI::App& app) {
    app.description("Runs a plan on CPU or GPU ranks.");
    app.allow_extras();
    return []() -> int {
      throw dhelix::Error(dhelix::ErrorCode::kUnsupported,
                          "not implemented yet: this version plans but does not train");
    };
  });
}
