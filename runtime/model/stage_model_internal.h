#pragma once
// Pieces shared by the model's files (runtime/model/*); not a public interface. Everything
// that depends on the backend B (runtime/model/model_backend.h) is a template here; the
// templates are instantiated once per backend (stage_model_cpu.cc,
// runtime/cuda/cuda_stage_model.cc).
//
// Buffers. Every activation a layer's ops touch for one micro-batch lives in one
// LayerState, created on the first bind of that (micro-batch, layer) pair; the stage
// extras have an EmbeddingState and a HeadState per micro-batch. Buffers come from the
// model's B::Memory and are never resized or freed while the model lives, so a closure
// bound once stays valid for every later iteration (start_iteration only zeroes gradients
// and losses). Activations are B::Act; per-row statistics (rstd, lse, the loss statistics,
// the per-token losses) and all gradients of weights are fp32.
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
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/rank_shape.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/model/element_type.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt::model_detail {

/// This rank's sizes (lib/rank_shape.h; rows are tokens of the micro-batch, b-major) and
/// the model's numeric constants the kernels take.
struct Dims : RankShape {
  float norm_eps = 1e-5f;  ///< ModelSpec::norm_epsilon(), as the fp32 kernels add it
  double rope_base = 1e4;  ///< ModelSpec::rope_theta()
  int64_t cp_rank = 0;     ///< this rank's CP coordinate (its chunks: layer_ops_cp.h)
  /// cp_comm_type a2a with cp > 1: Ulysses' all-to-alls (layer_ops_ulysses.h) instead of
  /// the ring; its layer keeps q, k, v and their gradients as cp = 1 does (same sizes).
  bool ulysses = false;
  /// cp_comm_type allgather with cp > 1: K, V all-gathered (layer_ops_kv_allgather.h).
  bool kv_allgather = false;
  /// cp_comm_type a2a+p2p: the all-to-all's sub-group size A (Ulysses inside it, the ring
  /// across the cp / A sub-groups, layer_ops_ulysses.h); 1 otherwise.
  int64_t cp_a2a = 1;
  bool hierarchical() const { return cp > 1 && cp_a2a > 1; }
  /// The K/V ring of layer_ops_cp.h runs this layer's attention over the whole CP group.
  bool ring() const { return cp > 1 && !ulysses && !kv_allgather && !hierarchical(); }
};

/// A parameter's initial values, computed on the host (parameter_init.cc).
struct HostTensor {
  std::string name;
  std::vector<float> values;
  bool sum_gradient_over_tp = false;
};

/// One parameter tensor of this rank and its gradient, in the backend's memory.
template <class B>
struct Parameter {
  std::string name;
  int64_t count = 0;
  float* values = nullptr;             ///< fp32 master weights
  typename B::Act* compute = nullptr;  ///< the copy ops read (== values where Act is float)
  float* gradient = nullptr;           ///< fp32, accumulated over micro-batches
  bool sum_gradient_over_tp = false;
};

/// Places a host tensor in `memory`: master, compute copy and a zeroed gradient.
template <class B>
Parameter<B> place_parameter(typename B::Memory& memory, const HostTensor& host) {
  Parameter<B> p;
  p.name = host.name;
  p.count = static_cast<int64_t>(host.values.size());
  p.values = memory.template allocate<float>(p.count);
  memory.upload(host.values.data(), p.values, p.count);
  p.compute = memory.compute_copy(p.values, p.count);
  p.gradient = memory.template allocate<float>(p.count);
  p.sum_gradient_over_tp = host.sum_gradient_over_tp;
  return p;
}

/// The parameters of one transformer layer (this rank's shards).
template <class P>
struct LayerTensors {
  P ln_attn;  ///< [h]
  P w_qkv;    ///< [qkv_width, h]: this rank's q heads, then its k heads, then v
  P w_proj;   ///< [h, q_width]: this rank's columns of the output projection
  P ln_mlp;   ///< [h]
  P w_fc1;    ///< [2 * ffn, h]: this rank's gate rows, then its up rows
  P w_fc2;    ///< [h, ffn]
};
using HostLayer = LayerTensors<HostTensor>;
template <class B>
using LayerParameters = LayerTensors<Parameter<B>>;

template <class B>
LayerParameters<B> place_layer(typename B::Memory& memory, const HostLayer& host) {
  return LayerParameters<B>{
      place_parameter<B>(memory, host.ln_attn), place_parameter<B>(memory, host.w_qkv),
      place_parameter<B>(memory, host.w_proj),  place_parameter<B>(memory, host.ln_mlp),
      place_parameter<B>(memory, host.w_fc1),   place_parameter<B>(memory, host.w_fc2)};
}

/// One layer's activations and activation gradients for one micro-batch.
template <class B>
struct LayerState {
  using A = typename B::Act;
  // Residual stream (owned by the model's residual maps).
  A* x = nullptr;     ///< residual(mb, l)
  A* out = nullptr;   ///< residual(mb, l + 1)
  A* dout = nullptr;  ///< residual_grad(mb, l)
  A* dx = nullptr;    ///< residual_grad(mb, l - 1)
  // Forward.
  A *ln1_out, *attn_in, *qkv, *q, *k, *v, *attn_out, *proj_out, *attn_branch;
  A *h1, *ln2_out, *mlp_in, *gate_up, *act, *fc2_out, *mlp_branch;
  float *ln1_rstd, *lse, *ln2_rstd;
  // Backward: d_<forward buffer>; the *_full ones are the gathered residual gradients.
  A *d_mlp_full, *d_act, *d_gate_up, *d_mlp_in, *d_ln2_out, *d_h1, *d_attn_full;
  A *d_attn_out, *dq, *dk, *dv, *d_qkv, *d_attn_in, *d_ln1_out;
  float* attn_delta;  ///< attention backward scratch [batch, heads, seq] (CUDA)
  // Ulysses only (layer_ops_ulysses.h): the head-split output the backward reads, the
  // head-split dO, and the all-to-alls' send and receive blocks.
  A* attn_out_heads = nullptr;
  A* d_out_heads = nullptr;
  A* a2a_send = nullptr;
  A* a2a_recv = nullptr;
  A* a2a_send_bwd = nullptr;
  A* a2a_recv_bwd = nullptr;
  A* dqkv_heads = nullptr;  ///< a2a+p2p: the ring's d_qkv in the head split
  // All-gather CP only (layer_ops_kv_allgather.h): this rank's [K | V] block (kept for the
  // backward's gather), the gathered blocks of the forward and of the backward, every
  // block's dK, dV share and this rank's summed block.
  A* kv_local = nullptr;
  A* kv_gathered = nullptr;
  A* kv_gathered_bwd = nullptr;
  A* dkv_shares = nullptr;
  A* dkv_mine = nullptr;
};

/// The embedding's buffers for one micro-batch.
template <class B>
struct EmbeddingState {
  using A = typename B::Act;
  A* partial = nullptr;    ///< [T, h] lookup of this rank's shard (SP); else == out
  A* out = nullptr;        ///< residual(mb, 0)
  A* dout = nullptr;       ///< residual_grad(mb, -1)
  A* dout_full = nullptr;  ///< [T, h] gathered (SP); else == dout
};

/// The final norm's, head's and loss's buffers for one micro-batch.
template <class B>
struct HeadState {
  using A = typename B::Act;
  A* x = nullptr;   ///< residual(mb, num_layers)
  A* dx = nullptr;  ///< residual_grad(mb, num_layers - 1)
  A *norm_out, *head_in, *logits, *dlogits, *d_head_in, *d_norm_out;
  float *norm_rstd, *stats_local, *stats_all, *lse, *token_loss;
};

/// Tokens and targets of one micro-batch, widened for the kernels, in the backend's
/// memory; the host keeps the targets to average the loss over valid tokens.
template <class B>
struct TokenBuffers {
  int64_t* tokens = nullptr;          ///< [T]
  int64_t* targets = nullptr;         ///< [T]
  std::vector<int64_t> host_targets;  ///< [T]
};

/// What a layer op's binder needs.
template <class B>
struct LayerOpContext {
  const Dims& dims;
  const typename B::Rope& rope;
  LayerParameters<B>& params;
  LayerState<B>& state;
};

/// The stage extras' parameters and per-micro-batch buffers, and where the loss goes.
template <class B>
struct ExtrasContext {
  const Dims& dims;
  Parameter<B>* embedding = nullptr;   ///< null unless the stage holds the embedding
  Parameter<B>* final_norm = nullptr;  ///< null unless the stage holds the head
  Parameter<B>* head = nullptr;
  EmbeddingState<B>* embedding_state = nullptr;
  HeadState<B>* head_state = nullptr;
  TokenBuffers<B>* tokens = nullptr;
  const float* loss_scale = nullptr;  ///< read when bwd.loss is run (CUDA: enqueued)
  /// fwd.loss sets [micro_batch] when it runs: the micro-batch's per-token losses are then
  /// in head_state->token_loss, to be averaged once the iteration has finished.
  std::vector<char>* loss_ran = nullptr;
  int64_t micro_batch = 0;
};

/// True when `op` names a stage-extra op of the embedding (first stage) or of the head
/// (last stage), in any TP mode.
bool is_embedding_op(const std::string& op);
bool is_head_op(const std::string& op);
/// True when `op` is an op id of a layer's DAGs in some TP mode.
bool is_layer_op(const std::string& op);

// Collectives over the TP group on the residual stream's layout.
template <class T>
constexpr ElementType element_type_of() {
  return std::is_same_v<T, float> ? ElementType::kFloat32 : ElementType::kBFloat16;
}
template <class T>
CollectiveRequest collective(CollectiveKind kind, const T* in, T* out, int64_t count) {
  return CollectiveRequest{kind, element_type_of<T>(), in, out, count};
}
/// all_gather of this rank's rows: in[rows, h] -> out[T, h].
template <class T>
CollectiveRequest gather_rows(const Dims& dims, const T* in, T* out) {
  return collective(CollectiveKind::kAllGather, in, out, dims.residual_elements());
}
/// reduce_scatter of partial sums: in[T, h] -> out[rows, h].
template <class T>
CollectiveRequest scatter_rows(const Dims& dims, const T* in, T* out) {
  return collective(CollectiveKind::kReduceScatter, in, out, dims.residual_elements());
}
/// all_reduce of partial sums in place: inout[T, h].
template <class T>
CollectiveRequest reduce_in_place(const Dims& dims, T* inout) {
  return collective<T>(CollectiveKind::kAllReduce, nullptr, inout, dims.full_elements());
}
/// A BoundOp running `request`.
template <class B>
BasicBoundOp<B> communication(CollectiveRequest request) {
  BasicBoundOp<B> op;
  op.collective = request;
  return op;
}
/// A BoundOp running `compute`.
template <class B>
BasicBoundOp<B> computation(typename BasicBoundOp<B>::Task compute) {
  BasicBoundOp<B> op;
  op.compute = std::move(compute);
  return op;
}

inline kernels::AttentionShape attention_shape(const Dims& d) {
  return kernels::AttentionShape{d.micro_batch, d.seq_shard, d.heads, d.kv_heads, d.head_dim};
}

/// Throws Error(kInvalidInput) saying `op` does not occur in this job's TP mode.
[[noreturn]] void throw_wrong_mode(const std::string& op, const Dims& dims);
/// Throws Error(kUnsupported) naming an op the runtime's model does not implement.
[[noreturn]] void throw_unknown_op(const std::string& op);
/// Throws Error(kUnsupported) listing every setting of `job` the runtime does not run;
/// `runs_moe`: the backend binds MoE layers (moe_layers_of.h), with their limits.
void check_supported(const JobSpec& job, bool runs_moe);
/// This rank's sizes.
Dims make_dims(const JobSpec& job, int64_t rank);
/// Mean of loss over the tokens whose target is not negative (0 when none is).
float mean_valid_loss(const std::vector<float>& token_loss, const std::vector<int64_t>& targets);

// Parameter initialisation (parameter_init.cc): host values.
/// Uniform in [-bound, bound) from (seed, tensor name, global element index).
float init_uniform(uint64_t seed, const std::string& name, int64_t global_index, float bound);
/// This rank's layer parameters, named "layers.<layer>.<part>".
HostLayer make_layer_parameters(const Dims& dims, int64_t layer, uint64_t seed);
/// Embedding table shard [vocab_local, h] ("embedding"); head shard ("head"); final norm.
HostTensor make_embedding(const Dims& dims, uint64_t seed);
HostTensor make_head(const Dims& dims, uint64_t seed);
HostTensor make_final_norm(const Dims& dims);

/// The part of a MoE layer's expert weights one rank holds: local experts [first, first +
/// local) of E (expert parallelism) and, of each, FFN columns [etp_rank ffn, +ffn) of
/// full_ffn = etp ffn (expert tensor parallelism; etp_rank 0 and ffn = full_ffn without).
struct ExpertSlice {
  int64_t first = 0, local = 0, hidden = 0, ffn = 0, full_ffn = 0, etp_rank = 0;
};
/// Initial values of the slice of the experts' fc1 [E, 2 full_ffn, h] (gate rows, then up
/// rows) a rank holds, [local, 2 ffn, h]: this rank's gate rows, then its up rows, each
/// element the full tensor's init_uniform(seed, name, index in the full tensor, bound). So
/// every EP and ETP split of the experts starts from the same model.
std::vector<float> expert_fc1_initial_values(uint64_t seed, const std::string& name,
                                             const ExpertSlice& slice, float bound);
/// As expert_fc1_initial_values for fc2 [E, h, full_ffn]: [local, h, ffn], this rank's
/// columns.
std::vector<float> expert_fc2_initial_values(uint64_t seed, const std::string& name,
                                             const ExpertSlice& slice, float bound);

}  // namespace dhelix::rt::model_detail
