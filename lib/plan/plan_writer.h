#pragma once
// Writing plans (lib/plan/plan.h) deterministically: fixed key order, times rounded to 3
// decimals (1 ns), ratios to 6, 2-space indentation and a final newline, written
// atomically. The same plan gives the same bytes; a plan read back (lib/plan/plan_reader.h)
// and written again gives the same bytes too.

#include <string>

#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// The plan as JSON, keys in the order of the schema.
OrderedJson plan_to_json(const Plan& plan);

/// plan_to_json dumped with 2-space indentation and a final newline.
std::string plan_to_text(const Plan& plan);

/// Writes plan_to_text atomically (write_file_atomically); Error(kIo) naming the path.
void write_plan(const std::string& path, const Plan& plan);

/// `value_us` rounded to 3 decimals (what the writer stores for a time).
double round_time_us(double value_us);

/// `ratio` rounded to 6 decimals (what the writer stores for a ratio).
double round_ratio(double ratio);

}  // namespace dhelix
