#pragma once
// Pieces shared by the StageModel's files (runtime/model/*.cc); not a public interface.
//
// Buffers. Every activation a layer's ops touch for one micro-batch lives in one
// LayerState, created on the first bind of that (micro-batch, layer) pair; the stage
// extras have an EmbeddingState and a HeadState per micro-batch. A state's buffers are
// never resized or freed while the model lives, so a closure bound once stays valid for
// every later iteration (start_iteration only zeroes gradients and losses).
//
// Aliases. Where a collective is absent the next op reads the previous op's buffer
// directly: without SP the gathered input of a column-parallel GEMM is the norm's output,
// and an all-reduce sums in place, so e.g. attn_branch == proj_out. The pointers below are
// set once at creation to the right buffer for the job's TP mode.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt::model_detail {

/// RMSNorm epsilon (Llama 2's 1e-5; ModelSpec has no field for it).
inline constexpr float kRmsNormEps = 1e-5f;
/// RoPE base (Llama 1 and 2; ModelSpec has no field for it).
inline constexpr double kRopeBase = 10000.0;

/// This rank's sizes. Rows are tokens of the micro-batch, b-major.
struct Dims {
  int64_t tp = 1, tp_rank = 0;
  bool sp = false;          ///< sequence parallelism in effect (tp > 1 and asked)
  int64_t batch = 1;        ///< sequences per micro-batch
  int64_t seq = 0;          ///< tokens per sequence
  int64_t tokens = 0;       ///< T = batch * seq: rows of the GEMMs
  int64_t rows = 0;         ///< rows of the residual stream on this rank: T / tp with SP, else T
  int64_t hidden = 0;       ///< h
  int64_t head_dim = 0;     ///< d
  int64_t heads = 0;        ///< query heads of this rank (H / tp)
  int64_t kv_heads = 0;     ///< KV heads of this rank (G / tp)
  int64_t q_width = 0;      ///< heads * d
  int64_t kv_width = 0;     ///< kv_heads * d
  int64_t qkv_width = 0;    ///< q_width + 2 * kv_width
  int64_t ffn = 0;          ///< FFN columns of this rank (F / tp)
  int64_t vocab = 0;        ///< V
  int64_t vocab_shard = 0;  ///< ceil(V / tp): entries per rank, the last may hold fewer
  int64_t vocab_begin = 0;  ///< first vocabulary entry of this rank
  int64_t vocab_local = 0;  ///< entries this rank holds
  int64_t num_layers = 0;   ///< of the whole model

  int64_t residual_elements() const { return rows * hidden; }
  int64_t full_elements() const { return tokens * hidden; }
};

/// One parameter tensor of this rank and its gradient.
struct Parameter {
  std::string name;
  std::vector<float> values;
  std::vector<float> gradient;
  bool sum_gradient_over_tp = false;
};

/// The parameters of one transformer layer (this rank's shards).
struct LayerParameters {
  Parameter ln_attn;  ///< [h]
  Parameter w_qkv;    ///< [qkv_width, h]: this rank's q heads, then its k heads, then v
  Parameter w_proj;   ///< [h, q_width]: this rank's columns of the output projection
  Parameter ln_mlp;   ///< [h]
  Parameter w_fc1;    ///< [2 * ffn, h]: this rank's gate rows, then its up rows
  Parameter w_fc2;    ///< [h, ffn]
};

/// Owns a set of buffers whose addresses never change.
class Arena {
 public:
  /// A zeroed buffer of `count` floats, valid while the arena lives.
  float* allocate(int64_t count);

 private:
  std::vector<std::vector<float>> buffers_;
};

/// One layer's activations and activation gradients for one micro-batch.
struct LayerState {
  Arena arena;
  // Residual stream (owned by the model's residual maps).
  float* x = nullptr;     ///< residual(mb, l)
  float* out = nullptr;   ///< residual(mb, l + 1)
  float* dout = nullptr;  ///< residual_grad(mb, l)
  float* dx = nullptr;    ///< residual_grad(mb, l - 1)
  // Forward.
  float *ln1_out, *ln1_rstd, *attn_in, *qkv, *q, *k, *v, *attn_out, *lse, *proj_out, *attn_branch;
  float *h1, *ln2_out, *ln2_rstd, *mlp_in, *gate_up, *act, *fc2_out, *mlp_branch;
  // Backward: d_<forward buffer>; the *_full ones are the gathered residual gradients.
  float *d_mlp_full, *d_act, *d_gate_up, *d_mlp_in, *d_ln2_out, *d_h1, *d_attn_full;
  float *d_attn_out, *dq, *dk, *dv, *d_qkv, *d_attn_in, *d_ln1_out;
};

/// The embedding's buffers for one micro-batch.
struct EmbeddingState {
  Arena arena;
  float* partial = nullptr;    ///< [T, h] lookup of this rank's shard (SP); else == out
  float* out = nullptr;        ///< residual(mb, 0)
  float* dout = nullptr;       ///< residual_grad(mb, -1)
  float* dout_full = nullptr;  ///< [T, h] gathered (SP); else == dout
};

/// The final norm's, head's and loss's buffers for one micro-batch.
struct HeadState {
  Arena arena;
  float* x = nullptr;   ///< residual(mb, num_layers)
  float* dx = nullptr;  ///< residual_grad(mb, num_layers - 1)
  float *norm_out, *norm_rstd, *head_in, *logits, *stats_local, *stats_all, *lse, *token_loss;
  float *dlogits, *d_head_in, *d_norm_out;
};

/// Tokens and targets of one micro-batch, widened for the kernels.
struct TokenBuffers {
  std::vector<int64_t> tokens;   ///< [T]
  std::vector<int64_t> targets;  ///< [T]
};

/// What a layer op's binder needs.
struct LayerOpContext {
  const Dims& dims;
  const cpu::RopeTable& rope;
  LayerParameters& params;
  LayerState& state;
};

/// Binds one layer op by id; nullopt when `op` is not a layer op of this TP mode's DAGs.
std::optional<BoundOp> bind_layer_forward(const std::string& op, const LayerOpContext& context);
std::optional<BoundOp> bind_layer_backward(const std::string& op, const LayerOpContext& context);

/// The stage extras' parameters and per-micro-batch buffers, and where the loss goes.
struct ExtrasContext {
  const Dims& dims;
  Parameter* embedding = nullptr;   ///< null unless the stage holds the embedding
  Parameter* final_norm = nullptr;  ///< null unless the stage holds the head
  Parameter* head = nullptr;
  EmbeddingState* embedding_state = nullptr;
  HeadState* head_state = nullptr;
  TokenBuffers* tokens = nullptr;
  const float* loss_scale = nullptr;     ///< read when bwd.loss runs
  std::vector<float>* losses = nullptr;  ///< micro_batch_losses(); fwd.loss writes [micro_batch]
  int64_t micro_batch = 0;
};

/// Binds one stage-extra op (embedding, head, loss); nullopt when unknown.
std::optional<BoundOp> bind_extra(const std::string& op, const ExtrasContext& context);

/// True when `op` names a stage-extra op of the embedding (first stage) or of the head
/// (last stage), in any TP mode.
bool is_embedding_op(const std::string& op);
bool is_head_op(const std::string& op);

// Collectives over the TP group on the residual stream's layout.
/// all_gather of this rank's rows: in[rows, h] -> out[T, h].
CollectiveRequest gather_rows(const Dims& dims, const float* in, float* out);
/// reduce_scatter of partial sums: in[T, h] -> out[rows, h].
CollectiveRequest scatter_rows(const Dims& dims, const float* in, float* out);
/// all_reduce of partial sums in place: inout[T, h].
CollectiveRequest reduce_in_place(const Dims& dims, float* inout);
/// A BoundOp running `request`.
BoundOp communication(CollectiveRequest request);
/// A BoundOp running `compute`.
BoundOp computation(std::function<void()> compute);

/// Throws Error(kInvalidInput) saying `op` does not occur in this job's TP mode.
[[noreturn]] void throw_wrong_mode(const std::string& op, const Dims& dims);

// Parameter initialisation (parameter_init.cc).
/// Uniform in [-bound, bound) from (seed, tensor name, global element index).
float init_uniform(uint64_t seed, const std::string& name, int64_t global_index, float bound);
/// This rank's layer parameters, named "layers.<layer>.<part>", gradients zeroed.
LayerParameters make_layer_parameters(const Dims& dims, int64_t layer, uint64_t seed);
/// Embedding table shard [vocab_local, h] ("embedding"); head shard ("head"); final norm.
Parameter make_embedding(const Dims& dims, uint64_t seed);
Parameter make_head(const Dims& dims, uint64_t seed);
Parameter make_final_norm(const Dims& dims);

}  // namespace dhelix::rt::model_detail
