#pragma once
// "Did you mean" suggestions for misspelt keys, flags and names.

#include <string>
#include <string_view>
#include <vector>

namespace dhelix {

/// Levenshtein distance between two strings (case-sensitive).
int edit_distance(std::string_view a, std::string_view b);

/// The candidate closest to `word`, if it is close enough to be a plausible typo
/// (distance at most max(2, |word|/3)); "" when none is.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// " (did you mean \"x\"?)" or "" when closest_match finds nothing.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace dhelix
