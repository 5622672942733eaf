#pragma once
// The model being trained: a decoder-only transformer, dense or mixture-of-experts.
// Read from dhelix's own model JSON (schemas/model.schema.json) or from a HuggingFace
// config.json (model_reader.h). Sizes are whole-model sizes; per-rank shapes follow
// from ParallelSpec.

#include <cstdint>
#include <optional>
#include <string>

#include "lib/dtype.h"

namespace dhelix {

enum class NormKind { kRmsNorm, kLayerNorm };
enum class ActivationKind { kSwiGlu, kGelu };
enum class PositionKind { kRope, kLearned };

const char* norm_kind_name(NormKind kind);              ///< "rmsnorm", "layernorm"
const char* activation_kind_name(ActivationKind kind);  ///< "swiglu", "gelu"
const char* position_kind_name(PositionKind kind);      ///< "rope", "learned"

/// Mixture-of-experts MLP: every layer's MLP is replaced by `num_experts` experts of which
/// each token visits `top_k`.
struct MoeSpec {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  /// Tokens an expert accepts = capacity_factor * tokens * top_k / num_experts (Switch/GShard);
  /// 0 means no capacity limit (dropless).
  double capacity_factor = 0.0;
  int64_t expert_ffn_hidden_size = 0;  ///< FFN size of one expert
  /// FFN size of the shared expert every token also passes, scaled by a sigmoid gate
  /// (Qwen2-MoE's shared_expert_intermediate_size); 0 = no shared expert.
  int64_t shared_expert_ffn_hidden_size = 0;
  /// Weight of the auxiliary load-balancing loss, alpha of Switch Transformer's
  /// alpha * E * sum_e f_e * P_e (Megatron-Core's --moe-aux-loss-coeff); absent = 0.01, the
  /// value Fedus et al. (2021) recommend. Read by the runtime, not by the planner's costs.
  std::optional<double> aux_loss_coeff = std::nullopt;

  bool has_shared_expert() const { return shared_expert_ffn_hidden_size > 0; }
  /// aux_loss_coeff, or its default.
  double aux_loss_weight() const { return aux_loss_coeff.value_or(kDefaultAuxLossCoeff); }
  static constexpr double kDefaultAuxLossCoeff = 0.01;
};

struct ModelSpec {
  std::string name;
  std::string source_file;  ///< where it was read from, for messages ("" when built in code)
  NormKind norm = NormKind::kRmsNorm;
  ActivationKind activation = ActivationKind::kSwiGlu;
  PositionKind position = PositionKind::kRope;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  ///< dense MLP size (unused by MoE layers)
  int64_t num_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;  ///< == num_attention_heads without GQA
  int64_t head_dim = 0;      ///< usually hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_seq_length = 0;  ///< the model's context length (a job may use less)
  bool tied_embeddings = false;
  bool linear_bias = false;  ///< GPT-style biases on the linear layers
  /// Biases on the Q, K and V projections only (Qwen2); implied by linear_bias.
  bool qkv_bias = false;
  /// Sliding-window attention (Mistral): each query attends to at most this many keys,
  /// itself included; 0 = the whole causal prefix.
  int64_t sliding_window = 0;
  DType dtype = DType::kBf16;
  std::optional<MoeSpec> moe;
  /// Epsilon added to the mean square (RMSNorm) or variance (LayerNorm) under the root;
  /// absent = 1e-5 (Llama 2's rms_norm_eps). Read by the runtime, not by the planner.
  std::optional<double> norm_eps = std::nullopt;
  /// Base theta of the rotary position frequencies theta^(-2i/d); absent = 10000 (RoFormer,
  /// Llama 2). Read by the runtime, not by the planner.
  std::optional<double> rope_base = std::nullopt;

  bool is_moe() const { return moe.has_value(); }
  /// norm_eps, or its default.
  double norm_epsilon() const { return norm_eps.value_or(kDefaultNormEps); }
  /// rope_base, or its default.
  double rope_theta() const { return rope_base.value_or(kDefaultRopeBase); }
  static constexpr double kDefaultNormEps = 1e-5;
  static constexpr double kDefaultRopeBase = 10000.0;
};

/// Keys one query attends to at most in a sequence of `seq_length` tokens:
/// min(seq_length, sliding_window), or seq_length without a window.
int64_t attended_keys(const ModelSpec& model, int64_t seq_length);

/// Parameters of one norm: RMSNorm has a scale (hidden_size), LayerNorm a scale and a shift.
int64_t norm_parameter_count(const ModelSpec& model);
/// Weight matrices of one MLP: 3 for SwiGLU (gate, up, down), 2 for GELU (up, down).
int64_t mlp_matrix_count(const ModelSpec& model);
/// Parameters of one MLP of FFN size `ffn`: mlp_matrix_count·hidden_size·ffn, plus the
/// biases of its matrices when `with_bias` (experts have none).
int64_t mlp_parameter_count(const ModelSpec& model, int64_t ffn, bool with_bias);
/// Parameters of one transformer layer (attention + MLP + norms), whole model width.
int64_t layer_parameter_count(const ModelSpec& model);
/// Parameters of the whole model (layers, embeddings, head unless tied, final norm).
int64_t parameter_count(const ModelSpec& model);
/// Parameters a token actually uses (MoE: top_k experts instead of all).
int64_t active_parameter_count(const ModelSpec& model);

/// Model FLOPs of one training iteration (forward + backward, no recomputation), using
/// Megatron-LM's closed form generalised to GQA, SwiGLU and MoE:
/// 12·B·s·L·h²·[(1 + G/H + a/h)·(q/h) + ((f/h)·k + f_s/h)·(3/2 if SwiGLU) + V/(2·L·h)]
/// where B is sequences per iteration, q = heads·head_dim, G = KV heads, f the (expert) FFN
/// size, k the top-k (1 for dense), f_s the shared expert's FFN size (0 without), a the
/// attended keys (s, or the sliding window when shorter). Causal masking is not discounted,
/// as in Megatron's count.
double training_flops_per_iteration(const ModelSpec& model, int64_t sequences, int64_t seq_length);

/// training_flops_per_iteration / tokens: model FLOPs per trained token.
double training_flops_per_token(const ModelSpec& model, int64_t seq_length);

}  // namespace dhelix
