#pragma once
// One name table per enum: the only place an enum's spelling in files and messages is
// written down. Readers take their allowed values from it (all()), writers and messages
// their names (name()), and parsing a name goes through it (parse()). Code past the file
// edge compares enum values, never names.
//
//   inline constexpr EnumNames<StreamClass, 3> kStreamClassNames{
//       {"compute", "local_comm", "cross_comm"}};   // index = enum value
//   kStreamClassNames.name(StreamClass::kLocalComm)   -> "local_comm"
//   kStreamClassNames.parse("cross_comm")             -> StreamClass::kCrossComm
//   kStreamClassNames.all()                           -> {"compute", "local_comm", "cross_comm"}

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dhelix {

/// The names of an enum whose values are 0 .. N-1, in value order.
template <typename Enum, size_t N>
struct EnumNames {
  std::array<const char*, N> names;

  /// The name of `value`; "?" for a value outside the table (a corrupt enum).
  constexpr const char* name(Enum value) const {
    const auto index = static_cast<size_t>(value);
    return index < N ? names[index] : "?";
  }
  /// The value named `text`, or nullopt.
  constexpr std::optional<Enum> parse(std::string_view text) const {
    for (size_t i = 0; i < N; ++i) {
      if (text == names[i]) return static_cast<Enum>(i);
    }
    return std::nullopt;
  }
  /// Every name, in value order (a reader's allowed values).
  std::vector<std::string> all() const { return {names.begin(), names.end()}; }
  /// Every value, in order.
  static constexpr std::array<Enum, N> values() {
    std::array<Enum, N> out{};
    for (size_t i = 0; i < N; ++i) out[i] = static_cast<Enum>(i);
    return out;
  }
};

}  // namespace dhelix
