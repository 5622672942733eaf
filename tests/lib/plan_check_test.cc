#include "lib/plan_check.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {}
}  // namespace dhelix
