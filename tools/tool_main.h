#pragma once
// What every dhelix binary does around its own work: --version, parsing the command line,
// and turning a dhelix::Error into a message on stderr and an exit status
// (lib/error.h: 2 invalid input, 3 I/O, 4 unsupported, 5 schema version, 6 infeasible).

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dhelix {

/// Adds a tool's options to `app` and returns the work to do once they are parsed; the
/// work returns the exit status. Options should live in an object the work owns.
using ToolSetup = std::function<std::function<int()>(CLI::App& app)>;

/// Runs a tool: sets up --version ("dhelix-plan 0.1.0 (git abcdef)"), parses argv
/// (a parse error prints the reason and a --help hint and returns 2), runs the work and
/// maps a thrown Error to `<tool>: error: <message>` on stderr (every line of a multi-line
/// message prefixed) and exit_status(code). Other exceptions are internal errors (70).
/// `quiet_command_line`: print nothing for --help, --version or a parse error, only return
/// the status (an MPI rank other than 0, whose output would repeat rank 0's).
int run_tool(const std::string& tool_name, int argc, char** argv, const ToolSetup& setup,
             bool quiet_command_line = false);

/// Prints "<tool>: warning: <line>" for every line of `message` on stderr.
void print_warning(const std::string& tool_name, const std::string& message);

/// The command line for provenance: argv with argv[0] replaced by the tool name, so that
/// where the binary was built does not change the output.
std::vector<std::string> tool_argv(const std::string& tool_name, int argc, char** argv);

}  // namespace dhelix
