#pragma once
// Rules a model description must follow whatever its format (dhelix JSON or HuggingFace
// config.json). Shared by model_reader.cc and hf_config_reader.cc; the JSON pointers in the
// messages name each format's own keys.

#include <cstdint>
#include <string>

#include "lib/error.h"
#include "lib/json_reader.h"
#include "lib/model_spec.h"

namespace dhelix {

// Upper bounds on model sizes. They sit far above any published model (the largest hidden
// size is about 2^14, vocabularies about 2^18) but keep every byte, FLOP and parameter count
// derived from them (products of up to four of these) well inside int64. docs/jobs.md lists
// them.
/// hidden_size, ffn_hidden_size, expert_ffn_hidden_size: at most 2^20.
inline constexpr IntRange kHiddenSizeRange = {.min = 1, .max = int64_t{1} << 20};
/// num_layers: at most 2^16.
inline constexpr IntRange kLayerCountRange = {.min = 1, .max = int64_t{1} << 16};
/// num_attention_heads, num_kv_heads: at most 2^16.
inline constexpr IntRange kHeadCountRange = {.min = 1, .max = int64_t{1} << 16};
/// head_dim: at most 2^14.
inline constexpr IntRange kHeadDimRange = {.min = 1, .max = int64_t{1} << 14};
/// vocab_size: at most 2^24.
inline constexpr IntRange kVocabSizeRange = {.min = 1, .max = int64_t{1} << 24};
/// max_seq_length: at most 2^24 tokens.
inline constexpr IntRange kSeqLengthRange = {.min = 1, .max = int64_t{1} << 24};
/// num_experts and top_k: at most 2^16 (top_k also at most num_experts).
inline constexpr IntRange kExpertCountRange = {.min = 1, .max = int64_t{1} << 16};
/// MoE capacity_factor: from 0 to 1000.
inline constexpr RealRange kCapacityFactorRange = {.min = 0.0, .max = 1000.0};

/// norm_eps: greater than 0, at most 1 (published models use 1e-6 to 1e-5).
inline constexpr RealRange kNormEpsRange = {.min = 0.0, .max = 1.0, .min_exclusive = true};
/// rope_base (rope_theta): greater than 1 (theta^(-2i/d) must fall with i), at most 1e12.
inline constexpr RealRange kRopeBaseRange = {.min = 1.0, .max = 1e12, .min_exclusive = true};
/// MoE aux_loss_coeff: from 0 (no balancing loss) to 1.
inline constexpr RealRange kAuxLossCoeffRange = {.min = 0.0, .max = 1.0};

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
