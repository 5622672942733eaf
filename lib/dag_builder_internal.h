#pragma once
// Pieces shared by the DAG builder's files (dag_builder*.cc); not a public interface.
//
// Work and traffic each op records (per rank; dt = bytes of the model's dtype):
//   GEMM (dense, grouped, head, router GEMM): flops 2·batch·m·n·k; reads the two operands
//     (batch·(m·k + k·n)·dt), writes the product (batch·m·n·dt).
//   attention forward: flops 4·b·heads·q_len·kv_len·head_dim (QKᵀ and PV, the full score
//     matrix: causal masking is recorded in shape.causal, not discounted, as in Megatron's
//     count); reads Q, K, V, writes O and the fp32 log-sum-exp. Backward: 2x the forward
//     flops (Megatron's 3x-forward rule for a layer); reads Q, K, V, O, dO and the
//     log-sum-exp, writes dQ, dK, dV.
//   memory-bound ops (norm, bias-dropout-add, activation, permutations, merge, embedding,
//     loss): a few flops per element (kFlopsPer* below, rough counts: they only matter as
//     "small"), the tensors they read and write.
//   communication: comm_bytes as nccl-tests counts size (see Op::comm_bytes), no flops.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"
#include "lib/placement.h"
#include "lib/rank_shape.h"

namespace dhelix::dag_detail {

// Flops per element of the memory-bound ops (forward; backward doubles them unless noted).
inline constexpr double kFlopsPerRmsNormElement = 4;    // square, accumulate, scale, weight
inline constexpr double kFlopsPerLayerNormElement = 7;  // mean and variance passes, shift
inline constexpr double kFlopsPerBdaElement = 3;        // bias, dropout mask, residual add
inline constexpr double kFlopsPerSwiGluElement = 6;     // silu (neg, exp, add, div), 2 muls
inline constexpr double kFlopsPerGeluElement = 8;       // tanh approximation
inline constexpr double kFlopsPerSoftmaxElement = 5;    // max, sub, exp, sum, div
inline constexpr double kFlopsPerMergeElement = 4;      // rescale by exp(lse_i − lse), add
inline constexpr double kFlopsPerCombineElement = 2;    // weight by router prob, add

/// Per-rank sizes (lib/rank_shape.h) and groups every part of the builder reads.
struct BuildContext : RankShape {
  const ModelSpec* model = nullptr;
  const ParallelSpec* parallel = nullptr;
  DType dtype = DType::kBf16;
  int64_t dt = 2;  ///< bytes per element of dtype
  ProcessGroup tp_group, cp_group, ep_group, dp_group;
  /// The expert-data-parallel group (fsdp_expert_group, lib/fsdp_sizes.h) where FSDP
  /// shards experts (fsdp_shards_experts); empty otherwise.
  ProcessGroup edp_group;
  /// The CP all-to-all's group (cp_group for a2a, the sub-group for a2a+p2p) and the K/V
  /// ring's (cp_group for p2p, the ring across sub-groups for a2a+p2p); size one otherwise.
  ProcessGroup cp_a2a_group, cp_ring_group;

  /// Bytes of `elements` values of the model's dtype.
  int64_t bytes(int64_t elements) const { return elements * dt; }
  /// Output columns of the first MLP GEMM: gate and up fused for SwiGLU.
  int64_t fc1_width(int64_t ffn_columns) const;
  const ProcessGroup& group(ParallelDim dim) const;
};

BuildContext make_context(const JobSpec& job, int64_t rank);

/// Adds `op` with an edge from every index in `after`; returns its index.
int64_t add_after(LayerDag& dag, Op op, const std::vector<int64_t>& after);

/// A (grouped) GEMM, head or router GEMM: m×k times k×n, `batch` independent products.
Op make_gemm(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, GemmRole role,
             int64_t batch, int64_t m, int64_t n, int64_t k);
/// The weight-gradient GEMM of a forward GEMM m×k·k×n: n×m·m×k (m = tokens is the
/// reduction), a movable sink.
Op make_wgrad(const BuildContext& ctx, std::string id, OpKind kind, int64_t batch, int64_t m,
              int64_t n, int64_t k);
/// The heads and lengths of one attention call: after Ulysses' all-to-all a rank holds
/// heads / A of each kind over A times the tokens (lib/dag_builder_cp_a2a.cc).
struct AttentionShape {
  int64_t heads = 0, kv_heads = 0;  ///< per rank
  int64_t q_len = 0, kv_len = 0;    ///< tokens of one sequence
};
/// This rank's heads, its sequence shard as queries, kv_len keys.
AttentionShape local_attention(const BuildContext& ctx, int64_t kv_len);
/// One attention call over this rank's heads: q_len queries against kv_len keys per sequence.
Op make_attention(const BuildContext& ctx, std::string id, Pass pass, int64_t kv_len);
/// One attention call of the given shape.
Op make_attention(const BuildContext& ctx, std::string id, Pass pass, const AttentionShape& shape);
/// A memory-bound op over an m×n tensor with the given flops per element, reading
/// `read_tensors` and writing `written_tensors` tensors of that size.
Op make_memory_op(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, int64_t m,
                  int64_t n, double flops_per_element, double read_tensors, double written_tensors);
/// The model's norm over rows × h (reads x and the weight; backward also reads dy).
Op make_norm(const BuildContext& ctx, std::string id, Pass pass, int64_t rows);
/// Bias-dropout-add over rows × h.
Op make_bda(const BuildContext& ctx, std::string id, Pass pass);
/// The model's activation producing rows × width (SwiGLU reads 2·width columns).
Op make_activation(const BuildContext& ctx, std::string id, Pass pass, int64_t rows, int64_t width);
/// A collective or send/recv over `dim`'s group of this rank; stream from the group's scope.
Op make_comm(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, ParallelDim dim,
             int64_t bytes, DType dtype);

/// A collective or send/recv over `group` (a CP sub-group of a2a+p2p), recorded as `dim`'s.
Op make_comm_on(const BuildContext& ctx, std::string id, OpKind kind, Pass pass, ParallelDim dim,
                const ProcessGroup& group, int64_t bytes, DType dtype);

/// "swiglu" or "gelu": the activation op's id stem.
std::string activation_id(const BuildContext& ctx);

// The parts of a layer, each adding its ops to a DAG and returning the ops whose outputs
// the next part consumes.

/// Attention core forward after the QKV GEMM: one flash attention (cp = 1), the CP ring
/// (p2p) or the all-to-all / all-gather forms (dag_builder_cp_a2a.cc). Returns the op
/// producing the attention output.
int64_t add_attention_core_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv);
/// Attention core backward after proj dgrad. Returns the ops producing dQ, dK, dV.
std::vector<int64_t> add_attention_core_backward(const BuildContext& ctx, LayerDag& dag,
                                                 int64_t proj_dgrad);

/// A K/V ring (dag_builder_cp.cc): `size` steps of attention of shape `step` over `group`,
/// each hop carrying `block_bytes` of K and V.
struct RingSpec {
  AttentionShape step;
  int64_t block_bytes = 0;
  const ProcessGroup* group = nullptr;
  int64_t size = 1;
};
/// The ring of cp_comm_type p2p over the whole CP group.
RingSpec p2p_ring(const BuildContext& ctx);
/// Ring forward from the op holding the local K/V block; returns the merge.
int64_t add_ring_forward(const BuildContext& ctx, LayerDag& dag, const RingSpec& ring,
                         int64_t block_source);
/// Ring backward from `start`; returns the ops producing dQ, dK, dV.
std::vector<int64_t> add_ring_backward(const BuildContext& ctx, LayerDag& dag, const RingSpec& ring,
                                       int64_t start);
/// The all-to-all (a2a, a2a+p2p) and all-gather forms of the attention core.
int64_t add_cp_a2a_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv);
std::vector<int64_t> add_cp_a2a_backward(const BuildContext& ctx, LayerDag& dag,
                                         int64_t proj_dgrad);
int64_t add_cp_allgather_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv);
std::vector<int64_t> add_cp_allgather_backward(const BuildContext& ctx, LayerDag& dag,
                                               int64_t proj_dgrad);
/// Fully sharded data parallelism (dag_builder_fsdp.cc): whether `pass` opens with a
/// parameter all-gather (optim_grads_params; the backward only with reshard_after_forward).
bool fsdp_gathers(const BuildContext& ctx, Pass pass);
/// Adds the pass's parameter all-gathers to the empty `dag` (index 0, and for a mixture of
/// experts' expert part index 1).
void add_fsdp_gather(const BuildContext& ctx, LayerDag& dag, Pass pass);
/// After the pass is built: edges from each part's gather to every op that reads that
/// part's weights, and in the backward each part's gradient reduce-scatter after every op
/// that writes one of its weight gradients. Nothing unless the job shards parameters.
void link_fsdp_collectives(const BuildContext& ctx, LayerDag& dag, Pass pass);
/// MoE MLP forward between ln_mlp and bda_mlp. Returns the op producing the MLP output.
int64_t add_moe_forward(const BuildContext& ctx, LayerDag& dag, int64_t ln_mlp);
/// MoE MLP backward between bda_mlp and ln_mlp. Returns the ops producing the gradient
/// of ln_mlp's output.
std::vector<int64_t> add_moe_backward(const BuildContext& ctx, LayerDag& dag, int64_t bda_mlp);
/// The shared expert of a MoE layer (dag_builder_shared_expert.cc), a tensor-parallel dense
/// MLP run after the routed experts. Forward starts after `after` (ln_mlp and unpermute)
/// and returns the op whose output is the MLP's; backward runs first from bda_mlp and
/// returns the op producing its share of d(ln_mlp output).
int64_t add_shared_expert_forward(const BuildContext& ctx, LayerDag& dag,
                                  const std::vector<int64_t>& after);
int64_t add_shared_expert_backward(const BuildContext& ctx, LayerDag& dag, int64_t bda_mlp);

}  // namespace dhelix::dag_detail
