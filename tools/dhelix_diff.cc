// dhelix-diff: Compares two plans.
// Only --help and --version work so far; plan comparison arrives with the emitter issue.

#include "lib/error.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  return dhelix::run_tool("dhelix-diff", argc, argv, [](CLI::App& app) {
    app.description("Compares two plans.");
    app.allow_extras();
    return []() -> int {
      throw dhelix::Error(dhelix::ErrorCode::kUnsupported,
                          "not implemented yet: plan comparison arrives with the emitter issue");
    };
  });
}
