#include "tools/option_values.h"

#include <charconv>
#include <functional>
#include <limits>
#include <string_view>
#include <system_error>
#include <type_traits>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

// The first spelling of `names` ("--tp" of "--tp,--tensor-model-parallel-size").
std::string first_name(const std::string& names) { return names.substr(0, names.find(',')); }

// The name of a check that does nothing but mark an option as read here
// (is_checked_integer_option); it has no description, so --help does not show it.
constexpr const char* kIntegerMark = "dhelix-integer";

std::string range_text(int64_t min, uint64_t max) { return fmt::format("{} to {}", min, max); }

// Why `text` is not a whole number in [min, max], or "" when it is one; `value` is set then.
// Signed and unsigned share it so that both say the same.
template <typename T>
std::string parse_whole(const std::string& text, T min, T max, T& value) {
  const std::string_view digits =
      text.starts_with('+') ? std::string_view(text).substr(1) : std::string_view(text);
  const std::string allowed = range_text(static_cast<int64_t>(min), static_cast<uint64_t>(max));
  const bool negative = digits.starts_with('-');
  // from_chars takes no minus sign for an unsigned type (CLI11 wrapped -1 to 2^64 - 1): a
  // negative number is "too small", not "not an integer".
  if (std::is_unsigned_v<T> && negative && digits.size() > 1 &&
      digits.find_first_not_of("0123456789", 1) == std::string_view::npos) {
    return fmt::format("{} is too small: give a whole number from {}", text, allowed);
  }
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (!digits.empty() && end == digits.data() + digits.size() &&
      error == std::errc::result_out_of_range) {
    return fmt::format("{} is too {}: give a whole number from {}", text,
                       negative ? "small" : "large", allowed);
  }
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) {
    return fmt::format("\"{}\" is not an integer: give a whole number from {}", text, allowed);
  }
  if (value < min || value > max) {
    return fmt::format("{} is too {}: give a whole number from {}", text,
                       value < min ? "small" : "large", allowed);
  }
  return "";
}

CLI::Option* add_parsed(CLI::App& app, const std::string& names, const std::string& help,
                        const std::string& allowed,
                        std::function<void(const std::string& flag, const std::string&)> set) {
  const std::string flag = first_name(names);
  return app
      .add_option_function<std::string>(
          names, [flag, set](const std::string& text) { set(flag, text); },
          help + " (" + allowed + ")")
      ->type_name("N")
      ->check(CLI::Validator([](std::string&) { return std::string(); }, "", kIntegerMark));
}

}  // namespace

int64_t parse_integer_value(const std::string& flag, const std::string& text, IntRange range) {
  int64_t value = 0;
  if (const std::string why = parse_whole(text, range.min, range.max, value); !why.empty()) {
    throw CLI::ValidationError(flag, why);
  }
  return value;
}

// The target's initial value is the default; --help shows it when it is a value one could
// give (a sentinel outside the range, such as --gpus 0 for "the job's", is not shown).
CLI::Option* show_default(CLI::Option* option, int64_t initial, IntRange range) {
  if (initial >= range.min && initial <= range.max) option->default_str(std::to_string(initial));
  return option;
}

CLI::Option* add_integer_option(CLI::App& app, const std::string& names, int64_t& target,
                                IntRange range, const std::string& help) {
  return show_default(
      add_parsed(app, names, help, range_text(range.min, range.max),
                 [&target, range](const std::string& flag, const std::string& text) {
                   target = parse_integer_value(flag, text, range);
                 }),
      target, range);
}

CLI::Option* add_integer_option(CLI::App& app, const std::string& names,
                                std::optional<int64_t>& target, IntRange range,
                                const std::string& help) {
  return add_parsed(app, names, help, range_text(range.min, range.max),
                    [&target, range](const std::string& flag, const std::string& text) {
                      target = parse_integer_value(flag, text, range);
                    });
}

CLI::Option* add_integer_option(CLI::App& app, const std::string& names, int& target,
                                IntRange range, const std::string& help) {
  DHELIX_CHECK(range.min >= std::numeric_limits<int>::min() &&
               range.max <= std::numeric_limits<int>::max());
  return show_default(
      add_parsed(app, names, help, range_text(range.min, range.max),
                 [&target, range](const std::string& flag, const std::string& text) {
                   target = static_cast<int>(parse_integer_value(flag, text, range));
                 }),
      target, range);
}

CLI::Option* add_uint64_option(CLI::App& app, const std::string& names, uint64_t& target,
                               const std::string& help) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  return add_parsed(app, names, help, range_text(0, kMax),
                    [&target](const std::string& flag, const std::string& text) {
                      uint64_t value = 0;
                      const std::string why = parse_whole<uint64_t>(text, 0, kMax, value);
                      if (!why.empty()) throw CLI::ValidationError(flag, why);
                      target = value;
                    })
      ->default_str(std::to_string(target));
}

bool is_checked_integer_option(CLI::Option& option) {
  try {
    option.get_validator(kIntegerMark);
    return true;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

void refuse_empty_values(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() <= 0) continue;  // a flag: no value to be empty
    // The placeholder (FILE, N, PLAN) says what to give; it is set before this runs.
    const std::string type = option->get_type_name();
    std::string what = option->get_option_text().empty() ? type.substr(0, type.find(':'))
                                                         : option->get_option_text();
    if (what.ends_with("...")) what.resize(what.size() - 3);  // TRACE...: one of several
    const std::string hint = option->get_required() ? "" : "; leave the option out for its default";
    // First among the option's checks, so that '' is never read as "not given" by a later
    // one, nor reported as "not an integer" or "not one of ...".
    option->transform(CLI::Validator(
        [what, hint](std::string& value) -> std::string {
          if (!value.empty()) return "";
          return fmt::format("'' (an empty value) is not allowed (expected {}{})",
                             what.empty() ? "a value" : what, hint);
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    refuse_empty_values(*sub);
  }
}

}  // namespace dhelix
