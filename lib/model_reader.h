#pragma once
// Reading a model description: dhelix's own model JSON (schemas/model.schema.json) or a
// HuggingFace config.json (Llama, Mistral/Mixtral, PhiMoE, GPT-2, GPT-NeoX families).

#include <string>

#include "lib/json_reader.h"
#include "lib/model_spec.h"

namespace dhelix {

/// Reads a model file, telling the two formats apart by content: a HuggingFace config has
/// "model_type" or "architectures"; ours has "schema_version". Collects every problem and
/// throws one Error naming the file, the JSON pointer, the value and the rule.
ModelSpec read_model_file(const std::string& path);

/// Model from dhelix's own JSON already parsed; problems go to `problems`. `pointer` is the
/// JSON pointer of `json` within `file` ("" for a model file; "/model" for a job's inline model).
ModelSpec model_from_json(const Json& json, const std::string& file, ProblemList& problems,
                          const std::string& pointer = "");

/// Model from a HuggingFace config.json already parsed; an unsupported architecture is an
/// Error(kUnsupported) listing the supported ones.
/// `pointer` as for model_from_json.
ModelSpec model_from_hf_config(const Json& json, const std::string& file, ProblemList& problems,
                               const std::string& pointer = "");

/// Model as dhelix's own JSON (for plan provenance and `--validate-only --json`).
OrderedJson model_to_json(const ModelSpec& model);

}  // namespace dhelix
