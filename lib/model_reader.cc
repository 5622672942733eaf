#include "lib/model_reader.h"

#include <fmt/format.h>

#include "lib/file_kind.h"
#include "lib/model_shape_checks.h"

namespace dhelix {
namespace {

constexpr int kModelSchemaMajor = 1;
constexpr const char* kModelSchemaVersion = "1.0.0";

const std::vector<std::string> kNormNames = {"rmsnorm", "layernorm"};
const std::vector<std::string> kActivationNames = {"swiglu", "gelu"};
const std::vector<std::string> kPositionNames = {"rope", "learned"};
const std::vector<std::string> kDTypeNames = {"bf16", "fp16", "fp32"};

std::optional<MoeSpec> read_moe(ObjectReader& root) {
  std::optional<ObjectReader> moe_reader = root.object("moe", Need::kOptional);
  if (!moe_reader) return std::nullopt;
  MoeSpec moe;
  moe.num_experts =
      moe_reader->integer("num_experts", Need::kRequired, kExpertCountRange).value_or(0);
  moe.top_k = moe_reader->integer("top_k", Need::kRequired, kExpertCountRange).value_or(0);
  moe.capacity_factor =
      moe_reader->real("capacity_factor", Need::kOptional, kCapacityFactorRange).value_or(0.0);
  moe.expert_ffn_hidden_size =
      moe_reader->integer("expert_ffn_hidden_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  moe.shared_expert_ffn_hidden_size =
      moe_reader->integer("shared_expert_ffn_hidden_size", Need::kOptional, kHiddenSizeRange)
          .value_or(0);
  moe.aux_loss_coeff = moe_reader->real("aux_loss_coeff", Need::kOptional, kAuxLossCoeffRange);
  moe_reader->finish();
  return moe;
}

void read_kinds(ObjectReader& root, ModelSpec& model) {
  if (auto norm = root.string("norm", Need::kOptional, kNormNames)) {
    model.norm = *norm == "layernorm" ? NormKind::kLayerNorm : NormKind::kRmsNorm;
  }
  if (auto activation = root.string("activation", Need::kOptional, kActivationNames)) {
    model.activation = *activation == "gelu" ? ActivationKind::kGelu : ActivationKind::kSwiGlu;
  }
  if (auto position = root.string("position", Need::kOptional, kPositionNames)) {
    model.position = *position == "learned" ? PositionKind::kLearned : PositionKind::kRope;
  }
  if (auto dtype = root.string("dtype", Need::kOptional, kDTypeNames)) {
    model.dtype = parse_dtype(*dtype).value_or(DType::kBf16);
  }
}

}  // namespace

void check_model_shape(const ModelSpec& model, bool head_dim_given,
                       const ModelFieldPointers& pointers, const std::string& file,
                       ProblemList& problems) {
  const int64_t heads = model.num_attention_heads;
  if (!head_dim_given && heads > 0 && model.hidden_size > 0 && model.hidden_size % heads != 0) {
    problems.add(file, pointers.hidden_size, std::to_string(model.hidden_size),
                 fmt::format("is not divisible by num_attention_heads = {}", heads));
  }
  if (heads > 0 && model.num_kv_heads > 0 && heads % model.num_kv_heads != 0) {
    problems.add(file, pointers.num_kv_heads, std::to_string(model.num_kv_heads),
                 fmt::format("does not divide num_attention_heads = {}", heads));
  }
  if (model.moe && model.moe->num_experts > 0 && model.moe->top_k > model.moe->num_experts) {
    problems.add(file, pointers.top_k, std::to_string(model.moe->top_k),
                 fmt::format("must be at most num_experts = {}", model.moe->num_experts));
  }
}

ModelSpec model_from_json(const Json& json, const std::string& file, ProblemList& problems,
                          const std::string& pointer) {
  ModelSpec model;
  model.source_file = file;
  ObjectReader root(json, file, pointer, problems);
  if (!root.is_object()) return model;
  check_schema_version(root, kModelSchemaMajor);
  root.allow("$schema");
  root.string("description", Need::kOptional);
  model.name = root.string("name", Need::kRequired).value_or("");
  read_kinds(root, model);
  model.hidden_size = root.integer("hidden_size", Need::kRequired, kHiddenSizeRange).value_or(0);
  model.num_layers = root.integer("num_layers", Need::kRequired, kLayerCountRange).value_or(0);
  model.num_attention_heads =
      root.integer("num_attention_heads", Need::kRequired, kHeadCountRange).value_or(0);
  model.num_kv_heads = root.integer("num_kv_heads", Need::kOptional, kHeadCountRange)
                           .value_or(model.num_attention_heads);
  const std::optional<int64_t> head_dim = root.integer("head_dim", Need::kOptional, kHeadDimRange);
  model.head_dim = head_dim.value_or(
      model.num_attention_heads > 0 ? model.hidden_size / model.num_attention_heads : 0);
  model.vocab_size = root.integer("vocab_size", Need::kRequired, kVocabSizeRange).value_or(0);
  // Only a learned position table needs the context length; otherwise the job's sequence
  // length is all the planner uses.
  model.max_seq_length =
      root.integer("max_seq_length",
                   model.position == PositionKind::kLearned ? Need::kRequired : Need::kOptional,
                   kSeqLengthRange)
          .value_or(0);
  model.tied_embeddings = root.boolean("tied_embeddings", Need::kOptional).value_or(false);
  model.linear_bias = root.boolean("linear_bias", Need::kOptional).value_or(false);
  model.qkv_bias = root.boolean("qkv_bias", Need::kOptional).value_or(false);
  model.sliding_window =
      root.integer("sliding_window", Need::kOptional, kSeqLengthRange).value_or(0);
  model.norm_eps = root.real("norm_eps", Need::kOptional, kNormEpsRange);
  model.rope_base = root.real("rope_base", Need::kOptional, kRopeBaseRange);
  model.moe = read_moe(root);
  // A MoE model's MLPs are all experts: the dense FFN size is then optional.
  model.ffn_hidden_size =
      root.integer("ffn_hidden_size", model.moe ? Need::kOptional : Need::kRequired,
                   kHiddenSizeRange)
          .value_or(0);
  root.finish();
  const ModelFieldPointers pointers{.hidden_size = root.pointer_of("hidden_size"),
                                    .num_attention_heads = root.pointer_of("num_attention_heads"),
                                    .num_kv_heads = root.pointer_of("num_kv_heads"),
                                    .top_k = root.pointer_of("moe") + "/top_k"};
  check_model_shape(model, head_dim.has_value(), pointers, file, problems);
  return model;
}

ModelSpec read_model_file(const std::string& path) {
  const Json json = read_json_file(path);
  require_file_kind(json, path, FileKind::kModel);
  ProblemList problems;
  ModelSpec model;
  if (json.is_object() && json.contains("schema_version")) {
    model = model_from_json(json, path, problems);
  } else if (json.is_object() && (json.contains("model_type") || json.contains("architectures"))) {
    model = model_from_hf_config(json, path, problems);
  } else if (json.is_object()) {
    problems.add(path, "", "",
                 "is neither a dhelix model file (no \"schema_version\") nor a HuggingFace "
                 "config.json (no \"architectures\" or \"model_type\")");
  } else {
    ObjectReader root(json, path, "", problems);  // records "expected an object"
  }
  problems.throw_if_any();
  return model;
}

OrderedJson model_to_json(const ModelSpec& model) {
  OrderedJson json;
  json["schema_version"] = kModelSchemaVersion;
  json["name"] = model.name;
  json["norm"] = norm_kind_name(model.norm);
  json["activation"] = activation_kind_name(model.activation);
  json["position"] = position_kind_name(model.position);
  json["hidden_size"] = model.hidden_size;
  if (model.ffn_hidden_size > 0) json["ffn_hidden_size"] = model.ffn_hidden_size;
  json["num_layers"] = model.num_layers;
  json["num_attention_heads"] = model.num_attention_heads;
  json["num_kv_heads"] = model.num_kv_heads;
  json["head_dim"] = model.head_dim;
  json["vocab_size"] = model.vocab_size;
  // Keys added after 1.0.0 are written only when set, so the dump (and the model hash in
  // plans) of a model without them is unchanged.
  if (model.max_seq_length > 0) json["max_seq_length"] = model.max_seq_length;
  json["tied_embeddings"] = model.tied_embeddings;
  json["linear_bias"] = model.linear_bias;
  if (model.qkv_bias) json["qkv_bias"] = true;
  if (model.sliding_window > 0) json["sliding_window"] = model.sliding_window;
  json["dtype"] = dtype_name(model.dtype);
  if (model.norm_eps) json["norm_eps"] = *model.norm_eps;
  if (model.rope_base) json["rope_base"] = *model.rope_base;
  if (model.moe) {
    OrderedJson moe;
    moe["num_experts"] = model.moe->num_experts;
    moe["top_k"] = model.moe->top_k;
    moe["capacity_factor"] = model.moe->capacity_factor;
    moe["expert_ffn_hidden_size"] = model.moe->expert_ffn_hidden_size;
    if (model.moe->has_shared_expert()) {
      moe["shared_expert_ffn_hidden_size"] = model.moe->shared_expert_ffn_hidden_size;
    }
    if (model.moe->aux_loss_coeff) moe["aux_loss_coeff"] = *model.moe->aux_loss_coeff;
    json["moe"] = std::move(moe);
  }
  return json;
}

}  // namespace dhelix
