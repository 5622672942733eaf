#include "tools/tool_main.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>

#include "lib/did_you_mean.h"
#include "lib/error.h"
#include "lib/provenance.h"
#include "tools/option_values.h"

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

// Every flag spelling of `app` and its subcommands: "--tp", "-o", ...
void collect_flag_names(const CLI::App& app, std::vector<std::string>& names) {
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    collect_flag_names(*sub, names);
  }
}

std::vector<std::string> dash_words(const std::string& flag) {
  std::vector<std::string> words;
  size_t start = flag.find_first_not_of('-');
  while (start != std::string::npos && start < flag.size()) {
    const size_t end = std::min(flag.find('-', start), flag.size());
    if (end > start) words.push_back(flag.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

// The flag a mistyped one most likely meant: the closest spelling (lib/did_you_mean.h), or
// else the shortest flag holding every word of it (--tensor-parallel ->
// --tensor-model-parallel-size); "" when none fits.
std::string suggest_flag(const std::string& typed, const std::vector<std::string>& flags) {
  if (std::string close = closest_match(typed, flags); !close.empty()) return close;
  const std::vector<std::string> words = dash_words(typed);
  if (words.empty()) return "";
  std::string best;
  for (const std::string& flag : flags) {
    if (!flag.starts_with("--")) continue;
    const std::vector<std::string> have = dash_words(flag);
    const bool holds_all = std::all_of(words.begin(), words.end(), [&](const std::string& w) {
      return std::find(have.begin(), have.end(), w) != have.end();
    });
    if (holds_all && (best.empty() || flag.size() < best.size())) best = flag;
  }
  return best;
}

// "--typed: did you mean --x?" lines for the unknown flags among CLI11's leftover arguments.
std::string unknown_flag_hints(const CLI::App& app, const std::vector<std::string>& extras) {
  std::vector<std::string> flags;
  collect_flag_names(app, flags);
  std::string hints;
  for (const std::string& extra : extras) {
    if (!extra.starts_with("-")) continue;
    const std::string typed = extra.substr(0, extra.find('='));
    if (const std::string flag = suggest_flag(typed, flags); !flag.empty()) {
      hints += "\n" + typed + ": did you mean " + flag + "?";
    }
  }
  return hints;
}

// One placeholder style in every --help: an upper-case noun for what the value is (FILE, N,
// PLAN). CLI11's generic type names are replaced: TEXT by the flag's own name (--report
// REPORT:{text,markdown,json}), FLOAT by NUMBER. Integer options show N
// (tools/option_values.h); one CLI11 reads itself (INT, UINT, or N set by hand) would clamp
// out-of-range values without a word, so it is a bug that stops every run of the tool.
void name_placeholders(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    const size_t colon = type.find(':');
    const std::string head = type.substr(0, colon);  // the rest comes from validators
    const bool integer = head == "INT" || head == "UINT" || head == "N";
    DHELIX_CHECK_MSG(!integer || is_checked_integer_option(*option),
                     option->get_name() + ": add integer options with add_integer_option");
    std::string named;
    if (head == "FLOAT") {
      named = "NUMBER";
    } else if (head == "TEXT" && !option->get_lnames().empty()) {
      named = option->get_lnames().front();
      std::transform(named.begin(), named.end(), named.begin(),
                     [](char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
    }
    if (!named.empty()) option->type_name(named);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    name_placeholders(*sub);
  }
}

// Exit statuses every tool shares (lib/error.h); a tool with more sets its own footer.
constexpr const char* kDefaultExitStatuses = R"(
Exit statuses:
  0   success
  2   bad input: a file or flag breaks a rule (the message names file, field, value, rule)
  3   a file cannot be read or written
  4   valid input dhelix does not support
  5   a file of another major schema version
  6   the job cannot run as asked (e.g. it does not fit in memory)
  70  internal error (a bug in dhelix)
)";

}  // namespace

void print_warning(const std::string& tool_name, const std::string& message) {
  print_prefixed(tool_name + ": warning: ", message);
}

std::vector<std::string> tool_argv(const std::string& tool_name, int argc, char** argv) {
  std::vector<std::string> args = {tool_name};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

int run_tool(const std::string& tool_name, int argc, char** argv, const ToolSetup& setup,
             bool quiet_command_line) {
  const std::string error_prefix = tool_name + ": error: ";
  try {
    CLI::App app;
    app.name(tool_name);
    app.set_version_flag("--version", tool_version_text(tool_name), "Print the version and exit");
    const std::function<int()> work = setup(app);
    if (app.get_footer().empty()) app.footer(kDefaultExitStatuses);
    name_placeholders(app);
    refuse_empty_values(app);  // '' is a mistake, never "not given" (tools/option_values.h)
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      if (quiet_command_line) {
        return error.get_exit_code() == 0 ? 0 : exit_status(ErrorCode::kInvalidInput);
      }
      if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
      std::string message = error.what();
      if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
        message += unknown_flag_hints(app, app.remaining());
      }
      print_prefixed(error_prefix, message);
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
