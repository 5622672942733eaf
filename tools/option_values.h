#pragma once
// Values on the command line, read one way by every option of every tool
// (docs/reliability.md, "Hardening 3: command-line values"):
//
//   dhelix-plan job.json -o ''              --output: '' (an empty value) is not allowed
//                                           (expected FILE; leave the option out ...)
//   dhelix-plan --search --gpus 0 ...       --gpus: 0 is too small: give a whole number
//                                           from 1 to 16777216
//   dhelix-run ... --seed 18446744073709551616   --seed: ... is too large: ... (never
//                                           clamped to 2^64 - 1)
//
// CLI11 reads an empty string as a value that a tool then takes for "not given"; its own
// integer conversion clamps out-of-range text to the type's limit (so 2^64 and 10^20 read
// as 2^64 - 1), and its range checks print their bound as a 309-digit double. So every
// integer option is added here, parsed exactly and checked against a stated range, and
// run_tool (tools/tool_main.h) calls refuse_empty_values on every tool's options.

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "lib/json_reader.h"  // IntRange

namespace dhelix {

/// Adds an integer option: its text must be a whole number (an optional leading '+') in
/// `range`, both ends included, else parsing fails with exit 2 and "<flag>: <text> is too
/// small / too large / not an integer: give a whole number from MIN to MAX". `names` as
/// CLI11 takes them ("--tp,--tensor-model-parallel-size"); messages name the first. The help
/// shows the placeholder N and ends with "(MIN to MAX)". The target is set only when the
/// option is given, so its initial value is the default, shown by --help when in `range`.
CLI::Option* add_integer_option(CLI::App& app, const std::string& names, int64_t& target,
                                IntRange range, const std::string& help);
CLI::Option* add_integer_option(CLI::App& app, const std::string& names,
                                std::optional<int64_t>& target, IntRange range,
                                const std::string& help);
/// The same for an int target; `range` must lie within int's.
CLI::Option* add_integer_option(CLI::App& app, const std::string& names, int& target,
                                IntRange range, const std::string& help);
/// An unsigned 64-bit option (a seed): every value from 0 to 2^64 - 1, nothing clamped.
CLI::Option* add_uint64_option(CLI::App& app, const std::string& names, uint64_t& target,
                               const std::string& help);

/// `text` as an integer in `range`, else a CLI::ValidationError naming `flag`, the text and
/// the range (what add_integer_option runs).
int64_t parse_integer_value(const std::string& flag, const std::string& text, IntRange range);

/// Whether `option` was added by add_integer_option or add_uint64_option. run_tool stops
/// a tool (an internal check) that has an integer option read any other way.
bool is_checked_integer_option(CLI::Option& option);

/// Makes every option of `app` and its subcommands that takes a value (positional ones
/// included) refuse an empty one: "<name>: '' (an empty value) is not allowed (expected
/// FILE; leave the option out for its default)". Checked before any other check of the
/// option. Call it once the placeholders are named.
void refuse_empty_values(CLI::App& app);

}  // namespace dhelix
