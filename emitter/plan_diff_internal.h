#pragma once
// Parts of diff_plans (emitter/plan_diff.h) shared between its source files.

#include <string>

#include "emitter/plan_diff.h"
#include "lib/plan/plan.h"

namespace dhelix::diff_detail {

/// The pairing section: stage counts and layer ranges, and every stage's pairing template
/// of `a` against the same stage's in `b` (emitter/plan_diff_pairing.cc).
PairingSection diff_pairing_section(const Plan& a, const Plan& b, double relative_tolerance);

/// A NumberChange for `field` with `changed` set by the tolerance.
NumberChange number_change(std::string field, double a, double b, double relative_tolerance,
                           bool integer = false);

}  // namespace dhelix::diff_detail
