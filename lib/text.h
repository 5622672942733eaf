#pragma once
// Small text helpers for messages and reports.

#include <string>
#include <string_view>
#include <vector>

namespace dhelix {

/// `parts` with `separator` between neighbours: join({"a", "b", "c"}, ", ") == "a, b, c";
/// "" for no parts.
std::string join(const std::vector<std::string>& parts, std::string_view separator);

}  // namespace dhelix
