#pragma once
// Suggestions for messages about a size that does not divide evenly: the nearest sizes that
// would, and the divisors to choose from. Used by job validation and by the planner's layer
// folding so that both speak the same arithmetic.

#include <cstdint>
#include <string>

namespace dhelix {

/// The multiples of `unit` nearest to `value` from below and above as "24 or 32", or only
/// the one above ("8") when the one below would be 0, so that no message suggests a size of 0.
/// Requires value >= 1 and unit >= 1.
std::string nearest_multiples_text(int64_t value, int64_t unit);

/// Every d in 1..n that divides n, ascending, as "1, 2, 4"; "" when n < 1.
std::string divisors_text(int64_t n);

}  // namespace dhelix
