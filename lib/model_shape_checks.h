#pragma once
// Rules a model description must follow whatever its format (dhelix JSON or HuggingFace
// config.json). Shared by model_reader.cc and hf_config_reader.cc; the JSON pointers in the
// messages name each format's own keys.

#include <string>

#include "lib/error.h"
#include "lib/model_spec.h"

namespace dhelix {

/// JSON pointers of the fields a shape rule may name, in the format being read.
struct ModelFieldPointers {
  std::string hidden_size = "/hidden_size";
  std::string num_attention_heads = "/num_attention_heads";
  std::string num_kv_heads = "/num_kv_heads";
  std::string top_k = "/moe/top_k";
};

/// Records a problem for every cross-field rule `model` breaks: hidden_size divisible by
/// the heads (when `head_dim_given` is false), KV heads dividing the heads, top_k at most
/// num_experts. Fields left at 0 (already reported as missing or bad) are skipped.
void check_model_shape(const ModelSpec& model, bool head_dim_given,
                       const ModelFieldPointers& pointers, const std::string& file,
                       ProblemList& problems);

}  // namespace dhelix
