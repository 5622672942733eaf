#include "tools/tool_main.h"

#include <cstdio>
#include <exception>

#include "lib/error.h"
#include "lib/provenance.h"

namespace dhelix {
namespace {

void print_prefixed(const std::string& prefix, const std::string& message) {
  size_t start = 0;
  do {
    const size_t end = std::min(message.find('\n', start), message.size());
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), message.substr(start, end - start).c_str());
    start = end + 1;
  } while (start <= message.size());
}

}  // namespace

void print_warning(const std::string& tool_name, const std::string& message) {
  print_prefixed(tool_name + ": warning: ", message);
}

std::vector<std::string> tool_argv(const std::string& tool_name, int argc, char** argv) {
  std::vector<std::string> args = {tool_name};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

int run_tool(const std::string& tool_name, int argc, char** argv, const ToolSetup& setup) {
  const std::string error_prefix = tool_name + ": error: ";
  try {
    CLI::App app;
    app.name(tool_name);
    app.set_version_flag("--version", tool_version_text(tool_name), "Print the version and exit");
    const std::function<int()> work = setup(app);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
      print_prefixed(error_prefix, error.what());
      std::fprintf(stderr, "Run with --help for more information.\n");
      return exit_status(ErrorCode::kInvalidInput);
    }
    return work();
  } catch (const Error& error) {
    print_prefixed(error_prefix, error.what());
    return exit_status(error.code());
  } catch (const std::exception& error) {
    print_prefixed(tool_name + ": internal error: ", error.what());
    return exit_status(ErrorCode::kInternal);
  }
}

}  // namespace dhelix
