#pragma once
// Strict reading of plan files (schemas/plan.schema.json) for dhelix-run and dhelix-diff:
// unknown keys (with a "did you mean"), missing fields, wrong types, values out of range
// and another major schema version are errors naming the file and the JSON pointer.

#include <string>

#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// Plan from parsed JSON; `file` names it in messages. Throws Error(kSchemaVersion) for
/// another major version, else one Error(kInvalidInput) listing every problem.
Plan plan_from_json(const Json& json, const std::string& file);

/// read_json_file + plan_from_json.
Plan read_plan(const std::string& path);

}  // namespace dhelix
