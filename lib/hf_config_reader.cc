#include "lib/hf_config_reader.h"

#include <filesystem>

#include <fmt/format.h>

#include "lib/model_shape_checks.h"
#include "lib/text.h"

// HuggingFace configs carry many keys that do not change the training shape (dropouts,
// token ids, rope scaling, ...): the reader asks only for the keys it maps and never
// calls ObjectReader::finish(), so unknown keys pass while wrong types of known keys are
// still reported. Keys may also be null in published configs (gpt2's "n_inner"), which
// means "use the family default".

namespace dhelix {
namespace {

enum class HfFamily { kLlama, kMistral, kMixtral, kPhiMoe, kQwen2, kQwen2Moe, kGpt2, kGptNeoX };

struct HfArchitecture {
  const char* architecture;
  const char* model_type;
  HfFamily family;
};

// Mistral shares Llama's config keys and layer shape, plus a sliding window; the newer transformers
// spelling "PhimoeForCausalLM" is accepted beside the published "PhiMoEForCausalLM".
constexpr HfArchitecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", HfFamily::kLlama},
    {"MistralForCausalLM", "mistral", HfFamily::kMistral},
    {"MixtralForCausalLM", "mixtral", HfFamily::kMixtral},
    {"PhiMoEForCausalLM", "phimoe", HfFamily::kPhiMoe},
    {"PhimoeForCausalLM", "phimoe", HfFamily::kPhiMoe},
    {"Qwen2ForCausalLM", "qwen2", HfFamily::kQwen2},
    {"Qwen2MoeForCausalLM", "qwen2_moe", HfFamily::kQwen2Moe},
    {"GPT2LMHeadModel", "gpt2", HfFamily::kGpt2},
    {"GPTNeoXForCausalLM", "gpt_neox", HfFamily::kGptNeoX},
};

std::string supported_list() { return join(supported_hf_architectures(), ", "); }

// The family named by "architectures" (first known entry) or, without it, "model_type".
HfFamily detect_family(const Json& json, const std::string& file) {
  if (auto it = json.find("architectures"); it != json.end() && it->is_array()) {
    for (const Json& entry : *it) {
      if (!entry.is_string()) continue;
      for (const HfArchitecture& known : kArchitectures) {
        if (entry.get<std::string>() == known.architecture) return known.family;
      }
    }
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: /architectures: {} is not supported; supported architectures: {}",
                            file, json_value_text(*it), supported_list()));
  }
  if (auto it = json.find("model_type"); it != json.end()) {
    if (it->is_string()) {
      for (const HfArchitecture& known : kArchitectures) {
        if (it->get<std::string>() == known.model_type) return known.family;
      }
    }
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: /model_type: {} is not supported; supported model types: llama, "
                            "mistral, mixtral, phimoe, gpt2, gpt_neox",
                            file, json_value_text(*it)));
  }
  throw Error(ErrorCode::kUnsupported,
              fmt::format("{}: neither \"architectures\" nor \"model_type\" says which model this "
                          "is; supported architectures: {}",
                          file, supported_list()));
}

// Reads an integer that may be absent or null (both mean "default").
std::optional<int64_t> nullable_integer(ObjectReader& root, const Json& json,
                                        const std::string& key, Need need, IntRange range) {
  if (json.contains(key) && json.at(key).is_null()) {
    root.allow(key);
    if (need == Need::kRequired) root.report(key, "null", "is required but null");
    return std::nullopt;
  }
  return root.integer(key, need, range);
}

// "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh": all GELU variants for our cost.
void check_activation(ObjectReader& root, const std::string& key, ActivationKind expected) {
  const std::optional<std::string> act = root.string(key, Need::kOptional);
  if (!act) return;
  const bool is_gelu = act->rfind("gelu", 0) == 0;
  const bool is_silu = *act == "silu" || *act == "swish";
  if (expected == ActivationKind::kGelu && !is_gelu) {
    root.report(key, json_value_text(Json(*act)), "is not a GELU variant, which this family needs");
  } else if (expected == ActivationKind::kSwiGlu && !is_silu) {
    root.report(key, json_value_text(Json(*act)), "is not \"silu\", which a SwiGLU MLP needs");
  }
}

void read_dtype(ObjectReader& root, ModelSpec& model) {
  // Newer transformers write "dtype"; published configs write "torch_dtype".
  const std::string key = root.has("torch_dtype") || !root.has("dtype") ? "torch_dtype" : "dtype";
  const std::optional<std::string> name = root.string(key, Need::kOptional);
  if (!name) return;
  if (const std::optional<DType> dtype = parse_dtype(*name)) {
    model.dtype = *dtype;
  } else {
    root.report(key, json_value_text(Json(*name)), "is not one of bfloat16, float16, float32");
  }
}

std::string name_from_file(const Json& json, const std::string& file) {
  if (auto it = json.find("_name_or_path");
      it != json.end() && it->is_string() && !it->get<std::string>().empty()) {
    return std::filesystem::path(it->get<std::string>()).filename().string();
  }
  const std::filesystem::path path(file);
  std::string stem = path.stem().string();  // "llama-3-8b.config" or "config"
  if (stem == "config") return path.parent_path().filename().string();
  const std::string suffix = ".config";
  if (stem.size() > suffix.size() && stem.ends_with(suffix))
    stem.resize(stem.size() - suffix.size());
  return stem;
}

// Llama, Mistral, Mixtral and PhiMoE share the key names of LlamaConfig.
void read_llama_like(ObjectReader& root, const Json& json, ModelSpec& model) {
  model.hidden_size = root.integer("hidden_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  model.num_layers =
      root.integer("num_hidden_layers", Need::kRequired, kLayerCountRange).value_or(0);
  model.num_attention_heads =
      root.integer("num_attention_heads", Need::kRequired, kHeadCountRange).value_or(0);
  model.num_kv_heads =
      nullable_integer(root, json, "num_key_value_heads", Need::kOptional, kHeadCountRange)
          .value_or(model.num_attention_heads);
  model.vocab_size = root.integer("vocab_size", Need::kRequired, kVocabSizeRange).value_or(0);
  // RoPE needs no position table: the context length only bounds the job's sequence
  // length, which every job sets, so a config without it is fine.
  model.max_seq_length =
      nullable_integer(root, json, "max_position_embeddings", Need::kOptional, kSeqLengthRange)
          .value_or(0);
  model.tied_embeddings = root.boolean("tie_word_embeddings", Need::kOptional).value_or(false);
  // PhiMoE's LayerNorm also reads its epsilon from rms_norm_eps.
  model.norm_eps = root.real("rms_norm_eps", Need::kOptional, kNormEpsRange);
  model.rope_base = root.real("rope_theta", Need::kOptional, kRopeBaseRange);
  check_activation(root, "hidden_act", ActivationKind::kSwiGlu);
}

// Mistral and Mixtral: "sliding_window" (null or absent: full attention) applies to every
// layer.
void read_sliding_window(ObjectReader& root, const Json& json, ModelSpec& model) {
  model.sliding_window =
      nullable_integer(root, json, "sliding_window", Need::kOptional, kSeqLengthRange).value_or(0);
}

// Qwen2 windows layers max_window_layers .. L-1 when use_sliding_window is true (its
// attention code); dhelix models one attention kind for all layers, so it takes a window
// on all layers or none and refuses a mix.
void read_qwen2_window(ObjectReader& root, const Json& json, ModelSpec& model) {
  const bool use_window = root.boolean("use_sliding_window", Need::kOptional).value_or(false);
  const std::optional<int64_t> window =
      nullable_integer(root, json, "sliding_window", Need::kOptional, kSeqLengthRange);
  const int64_t first_windowed =
      nullable_integer(root, json, "max_window_layers", Need::kOptional, kLayerCountRange)
          .value_or(0);
  if (!use_window || !window || first_windowed >= model.num_layers) return;
  if (first_windowed > 0) {
    root.report("max_window_layers", std::to_string(first_windowed),
                fmt::format("windows only layers {} .. {} of {}; dhelix models the same "
                            "attention in every layer (set it to 0 or to num_hidden_layers)",
                            first_windowed, model.num_layers - 1, model.num_layers));
    return;
  }
  model.sliding_window = *window;
}

// Qwen2: Llama's shape with biases on the Q, K and V projections only (no attention_bias
// or mlp_bias keys).
void read_qwen2(ObjectReader& root, const Json& json, ModelSpec& model) {
  read_llama_like(root, json, model);
  model.ffn_hidden_size =
      root.integer("intermediate_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  model.qkv_bias = true;
  read_qwen2_window(root, json, model);
}

// Qwen2-MoE: Qwen2 attention; every MLP is num_experts routed experts of
// moe_intermediate_size plus one gated shared expert of shared_expert_intermediate_size.
// Dense layers between sparse ones (decoder_sparse_step > 1, mlp_only_layers) are refused:
// dhelix models one MLP kind for all layers.
void read_qwen2_moe(ObjectReader& root, const Json& json, ModelSpec& model) {
  read_llama_like(root, json, model);
  model.qkv_bias = true;
  read_qwen2_window(root, json, model);
  MoeSpec moe;
  moe.num_experts = root.integer("num_experts", Need::kOptional, kExpertCountRange).value_or(60);
  moe.top_k = root.integer("num_experts_per_tok", Need::kOptional, kExpertCountRange).value_or(4);
  moe.expert_ffn_hidden_size =
      root.integer("moe_intermediate_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  moe.shared_expert_ffn_hidden_size =
      nullable_integer(root, json, "shared_expert_intermediate_size", Need::kOptional,
                       kHiddenSizeRange)
          .value_or(0);
  moe.aux_loss_coeff = root.real("router_aux_loss_coef", Need::kOptional, kAuxLossCoeffRange);
  model.moe = moe;
  const int64_t step =
      root.integer("decoder_sparse_step", Need::kOptional, kLayerCountRange).value_or(1);
  if (step != 1) {
    root.report("decoder_sparse_step", std::to_string(step),
                "makes only every n-th layer sparse; dhelix models the same MLP in every layer "
                "(1)");
  }
  if (auto it = json.find("mlp_only_layers"); it != json.end() && it->is_array() && !it->empty()) {
    root.report("mlp_only_layers", json_value_text(*it),
                "lists dense layers; dhelix models the same MLP in every layer ([])");
  }
  root.allow("mlp_only_layers");
}

void read_llama(ObjectReader& root, const Json& json, ModelSpec& model) {
  read_llama_like(root, json, model);
  model.ffn_hidden_size =
      root.integer("intermediate_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  const bool attention_bias = root.boolean("attention_bias", Need::kOptional).value_or(false);
  const bool mlp_bias = root.boolean("mlp_bias", Need::kOptional).value_or(false);
  if (mlp_bias != attention_bias) {
    root.report("mlp_bias", mlp_bias ? "true" : "false",
                fmt::format("differs from attention_bias = {}; dhelix models have one linear_bias "
                            "for both",
                            attention_bias));
  }
  model.linear_bias = attention_bias;
}

// Mixtral and PhiMoE: every MLP is `num_local_experts` experts of size intermediate_size.
void read_moe(ObjectReader& root, ModelSpec& model, int64_t default_experts,
              int64_t default_top_k) {
  MoeSpec moe;
  moe.num_experts = root.integer("num_local_experts", Need::kOptional, kExpertCountRange)
                        .value_or(default_experts);
  moe.top_k = root.integer("num_experts_per_tok", Need::kOptional, kExpertCountRange)
                  .value_or(default_top_k);
  moe.expert_ffn_hidden_size =
      root.integer("intermediate_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  moe.aux_loss_coeff = root.real("router_aux_loss_coef", Need::kOptional, kAuxLossCoeffRange);
  model.moe = moe;
}

void read_gpt2(ObjectReader& root, const Json& json, ModelSpec& model) {
  model.norm = NormKind::kLayerNorm;
  model.activation = ActivationKind::kGelu;
  model.position = PositionKind::kLearned;
  model.linear_bias = true;
  model.hidden_size = root.integer("n_embd", Need::kRequired, kHiddenSizeRange).value_or(0);
  // GPT2Config: n_inner null means 4 * n_embd (at most 2^22, as n_embd is bounded).
  model.ffn_hidden_size = nullable_integer(root, json, "n_inner", Need::kOptional, kHiddenSizeRange)
                              .value_or(4 * model.hidden_size);
  model.num_layers = root.integer("n_layer", Need::kRequired, kLayerCountRange).value_or(0);
  model.num_attention_heads = root.integer("n_head", Need::kRequired, kHeadCountRange).value_or(0);
  model.num_kv_heads = model.num_attention_heads;
  model.vocab_size = root.integer("vocab_size", Need::kRequired, kVocabSizeRange).value_or(0);
  model.max_seq_length = root.integer("n_positions", Need::kRequired, kSeqLengthRange).value_or(0);
  // GPT-2 ties its output head to the token embedding unless told otherwise.
  model.tied_embeddings = root.boolean("tie_word_embeddings", Need::kOptional).value_or(true);
  model.norm_eps = root.real("layer_norm_epsilon", Need::kOptional, kNormEpsRange);
  check_activation(root, "activation_function", ActivationKind::kGelu);
}

void read_gpt_neox(ObjectReader& root, ModelSpec& model) {
  model.norm = NormKind::kLayerNorm;
  model.activation = ActivationKind::kGelu;
  model.position = PositionKind::kRope;
  model.hidden_size = root.integer("hidden_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  model.ffn_hidden_size =
      root.integer("intermediate_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  model.num_layers =
      root.integer("num_hidden_layers", Need::kRequired, kLayerCountRange).value_or(0);
  model.num_attention_heads =
      root.integer("num_attention_heads", Need::kRequired, kHeadCountRange).value_or(0);
  model.num_kv_heads = model.num_attention_heads;
  model.vocab_size = root.integer("vocab_size", Need::kRequired, kVocabSizeRange).value_or(0);
  model.max_seq_length =
      root.integer("max_position_embeddings", Need::kRequired, kSeqLengthRange).value_or(0);
  model.tied_embeddings = root.boolean("tie_word_embeddings", Need::kOptional).value_or(false);
  // GPTNeoXConfig's attention_bias defaults to true; its MLP always has biases.
  model.linear_bias = root.boolean("attention_bias", Need::kOptional).value_or(true);
  model.norm_eps = root.real("layer_norm_eps", Need::kOptional, kNormEpsRange);
  model.rope_base = root.real("rotary_emb_base", Need::kOptional, kRopeBaseRange);
  check_activation(root, "hidden_act", ActivationKind::kGelu);
}

}  // namespace

std::vector<std::string> supported_hf_architectures() {
  std::vector<std::string> names;
  for (const HfArchitecture& known : kArchitectures) names.emplace_back(known.architecture);
  return names;
}

ModelSpec model_from_hf_config(const Json& json, const std::string& file, ProblemList& problems,
                               const std::string& pointer) {
  ModelSpec model;
  model.source_file = file;
  ObjectReader root(json, file, pointer, problems);
  if (!root.is_object()) return model;
  const HfFamily family = detect_family(json, file);
  model.name = name_from_file(json, file);
  ModelFieldPointers pointers{.hidden_size = root.pointer_of("hidden_size"),
                              .num_attention_heads = root.pointer_of("num_attention_heads"),
                              .num_kv_heads = root.pointer_of("num_key_value_heads"),
                              .top_k = root.pointer_of("num_experts_per_tok")};
  switch (family) {
    case HfFamily::kLlama:
      read_llama(root, json, model);
      break;
    case HfFamily::kMistral:
      read_llama(root, json, model);
      read_sliding_window(root, json, model);
      break;
    case HfFamily::kMixtral:
      read_llama_like(root, json, model);
      read_sliding_window(root, json, model);
      read_moe(root, model, 8, 2);  // MixtralConfig defaults
      break;
    case HfFamily::kQwen2:
      read_qwen2(root, json, model);
      break;
    case HfFamily::kQwen2Moe:
      read_qwen2_moe(root, json, model);
      pointers.top_k = root.pointer_of("num_experts_per_tok");
      break;
    case HfFamily::kPhiMoe:
      read_llama_like(root, json, model);
      model.norm = NormKind::kLayerNorm;  // PhiMoE layers use nn.LayerNorm
      // Attention biases only; the output head's bias (lm_head_bias) is vocab_size
      // parameters dhelix does not count.
      model.linear_bias = root.boolean("attention_bias", Need::kOptional).value_or(false);
      read_moe(root, model, 16, 2);  // PhiMoEConfig defaults
      break;
    case HfFamily::kGpt2:
      read_gpt2(root, json, model);
      pointers = {.hidden_size = root.pointer_of("n_embd"),
                  .num_attention_heads = root.pointer_of("n_head"),
                  .num_kv_heads = root.pointer_of("n_head"),
                  .top_k = ""};
      break;
    case HfFamily::kGptNeoX:
      read_gpt_neox(root, model);
      break;
  }
  const std::optional<int64_t> head_dim =
      family == HfFamily::kGpt2
          ? std::nullopt
          : nullable_integer(root, json, "head_dim", Need::kOptional, kHeadDimRange);
  model.head_dim = head_dim.value_or(
      model.num_attention_heads > 0 ? model.hidden_size / model.num_attention_heads : 0);
  read_dtype(root, model);
  check_model_shape(model, head_dim.has_value(), pointers, file, problems);
  return model;
}

}  // namespace dhelix
