#include "lib/divisibility_hints.h"

#include <fmt/format.h>

#include <vector>

#include "lib/error.h"
#include "lib/text.h"

namespace dhelix {

std::string nearest_multiples_text(int64_t value, int64_t unit) {
  DHELIX_CHECK(value >= 1 && unit >= 1);
  const int64_t below = value - value % unit;
  const int64_t above = below + unit;
  if (below == 0) return std::to_string(above);
  return fmt::format("{} or {}", below, above);
}

std::string divisors_text(int64_t n) {
  std::vector<std::string> divisors;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) divisors.push_back(std::to_string(d));
  }
  return join(divisors, ", ");
}

}  // namespace dhelix
