#include "lib/model_spec.h"

namespace dhelix {

const char* norm_kind_name(NormKind kind) {
  switch (kind) {
    case NormKind::kRmsNorm:
      return "rmsnorm";
    case NormKind::kLayerNorm:
      return "layernorm";
  }
  return "?";
}

const char* activation_kind_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kSwiGlu:
      return "swiglu";
    case ActivationKind::kGelu:
      return "gelu";
  }
  return "?";
}

const char* position_kind_name(PositionKind kind) {
  switch (kind) {
    case PositionKind::kRope:
      return "rope";
    case PositionKind::kLearned:
      return "learned";
  }
  return "?";
}

int64_t attended_keys(const ModelSpec& model, int64_t seq_length) {
  if (model.sliding_window > 0 && model.sliding_window < seq_length) return model.sliding_window;
  return seq_length;
}

int64_t norm_parameter_count(const ModelSpec& model) {
  return model.norm == NormKind::kLayerNorm ? 2 * model.hidden_size : model.hidden_size;
}

int64_t mlp_matrix_count(const ModelSpec& model) {
  return model.activation == ActivationKind::kSwiGlu ? 3 : 2;
}

int64_t mlp_parameter_count(const ModelSpec& model, int64_t ffn, bool with_bias) {
  const int64_t h = model.hidden_size;
  int64_t count = mlp_matrix_count(model) * h * ffn;
  // Bias: one per output feature, ffn for each matrix into the FFN width, h for the last.
  if (with_bias) count += (mlp_matrix_count(model) - 1) * ffn + h;
  return count;
}

namespace {

// Q, K, V and output projections (plus their biases for GPT-style models).
int64_t attention_parameter_count(const ModelSpec& model) {
  const int64_t h = model.hidden_size;
  const int64_t q = model.num_attention_heads * model.head_dim;
  const int64_t kv = model.num_kv_heads * model.head_dim;
  int64_t count = h * q + 2 * h * kv + q * h;
  if (model.linear_bias) {
    count += q + 2 * kv + h;
  } else if (model.qkv_bias) {
    count += q + 2 * kv;  // Qwen2: the output projection has none
  }
  return count;
}

// The MLP part of one layer counting `experts_counted` experts (MoE) or the dense MLP.
// Experts and the router carry no biases, as in Mixtral and PhiMoE. A shared expert
// (Qwen2-MoE) is a bias-free MLP every token passes, plus its gate: one h -> 1 projection.
int64_t layer_mlp_parameter_count(const ModelSpec& model, int64_t experts_counted) {
  if (!model.is_moe()) return mlp_parameter_count(model, model.ffn_hidden_size, model.linear_bias);
  const int64_t router = model.hidden_size * model.moe->num_experts;
  int64_t count = router + experts_counted *
                               mlp_parameter_count(model, model.moe->expert_ffn_hidden_size, false);
  if (model.moe->has_shared_expert()) {
    count += mlp_parameter_count(model, model.moe->shared_expert_ffn_hidden_size, false) +
             model.hidden_size;
  }
  return count;
}

int64_t non_layer_parameter_count(const ModelSpec& model) {
  const int64_t embedding = model.vocab_size * model.hidden_size;
  int64_t count = embedding + norm_parameter_count(model);  // embedding + final norm
  if (!model.tied_embeddings) count += embedding;           // output head
  if (model.position == PositionKind::kLearned) count += model.max_seq_length * model.hidden_size;
  return count;
}

int64_t layer_count_with_experts(const ModelSpec& model, int64_t experts_counted) {
  return attention_parameter_count(model) + layer_mlp_parameter_count(model, experts_counted) +
         2 * norm_parameter_count(model);
}

}  // namespace

int64_t layer_parameter_count(const ModelSpec& model) {
  return layer_count_with_experts(model, model.is_moe() ? model.moe->num_experts : 1);
}

int64_t parameter_count(const ModelSpec& model) {
  return model.num_layers * layer_parameter_count(model) + non_layer_parameter_count(model);
}

int64_t active_parameter_count(const ModelSpec& model) {
  const int64_t experts = model.is_moe() ? model.moe->top_k : 1;
  return model.num_layers * layer_count_with_experts(model, experts) +
         non_layer_parameter_count(model);
}

double training_flops_per_iteration(const ModelSpec& model, int64_t sequences, int64_t seq_length) {
  const auto h = static_cast<double>(model.hidden_size);
  const auto s = static_cast<double>(seq_length);
  const auto layers = static_cast<double>(model.num_layers);
  const auto heads = static_cast<double>(model.num_attention_heads);
  const auto groups = static_cast<double>(model.num_kv_heads);
  const auto q = static_cast<double>(model.num_attention_heads * model.head_dim);
  const auto vocab = static_cast<double>(model.vocab_size);
  const double ffn = static_cast<double>(model.is_moe() ? model.moe->expert_ffn_hidden_size
                                                        : model.ffn_hidden_size);
  const double top_k = model.is_moe() ? static_cast<double>(model.moe->top_k) : 1.0;
  const double shared =
      model.is_moe() ? static_cast<double>(model.moe->shared_expert_ffn_hidden_size) : 0.0;
  const double gated = model.activation == ActivationKind::kSwiGlu ? 1.5 : 1.0;
  const auto keys = static_cast<double>(attended_keys(model, seq_length));

  const double attention = (1.0 + groups / heads + keys / h) * (q / h);
  const double mlp = ((ffn / h) * top_k + shared / h) * gated;
  const double logits = vocab / (2.0 * layers * h);
  return 12.0 * static_cast<double>(sequences) * s * layers * h * h * (attention + mlp + logits);
}

double training_flops_per_token(const ModelSpec& model, int64_t seq_length) {
  if (seq_length <= 0) return 0.0;
  return training_flops_per_iteration(model, 1, seq_length) / static_cast<double>(seq_length);
}

}  // namespace dhelix
