#pragma once
// BasicStageModel<B>::Impl, the state of one rank's model slice: its parameters, and the
// buffers of each (micro-batch, layer) and of the stage extras, made on first use from the
// activation arena (runtime/model/activation_arena.h) with the span each lives for
// (runtime/memory/buffer_spans.h). Included by stage_model_impl.h only, which binds ops to
// these buffers.

#include <fmt/format.h>

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/model/activation_arena.h"
#include "runtime/model/fsdp_layers.h"
#include "runtime/model/layer_ops_backward.h"
#include "runtime/model/layer_ops_cp.h"
#include "runtime/model/layer_ops_forward.h"
#include "runtime/model/layer_ops_kv_allgather.h"
#include "runtime/model/layer_ops_ulysses.h"
#include "runtime/model/moe_layers_cpu.h"
#include "runtime/model/moe_layers_of.h"
#include "runtime/model/moe_layers_padded.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_internal.h"
#include "runtime/model/stage_ops.h"

namespace dhelix::rt {

template <class B>
struct BasicStageModel<B>::Impl {
  using A = typename B::Act;
  using Key = std::pair<int64_t, int64_t>;  // (micro-batch, layer)

  explicit Impl(typename B::MemoryConfig config) : memory(config), arena(memory) {}

  typename B::Memory memory;
  // Every activation buffer: its span and name, and (once plan_activation_memory has run)
  // its place in the rank's arena (runtime/model/activation_arena.h).
  ActivationArena<typename B::Memory> arena;
  model_detail::Dims dims;
  int64_t rank = 0;
  std::map<int64_t, model_detail::LayerParameters<B>> layers;  // by absolute layer index
  std::optional<model_detail::Parameter<B>> embedding, final_norm, head;
  std::optional<typename B::Rope> rope;
  float loss_scale = 1.0f;
  std::vector<char> loss_ran;  // by micro-batch: fwd.loss ran (or was enqueued) this iteration
  // Buffers, created on first use (closures hold their addresses) from the arena.
  std::map<Key, A*> residuals, residual_grads;
  // Tokens and per-token losses: written before and read after an iteration, so outside the
  // arena, made once.
  std::map<int64_t, model_detail::TokenBuffers<B>> tokens;
  std::map<int64_t, float*> token_losses;
  std::map<Key, std::unique_ptr<model_detail::LayerState<B>>> layer_states;
  // Activation recompute (the plan's bwd.recompute.* ops): the backward reads the
  // recomputed activations from states of their own, never the forward's (see bind).
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  std::map<Key, std::unique_ptr<model_detail::LayerState<B>>> recompute_states;
  std::map<int64_t, std::unique_ptr<model_detail::EmbeddingState<B>>> embedding_states;
  std::map<int64_t, std::unique_ptr<model_detail::HeadState<B>>> head_states;
  // Context parallelism (cp > 1): each layer's ring buffers (layer_ops_cp.h), and with
  // recompute a second set the repeated ring and the backward use (see cp_state).
  std::map<Key, std::unique_ptr<model_detail::CpLayerState<B>>> cp_states, recompute_cp_states;
  // The MoE MLPs of a mixture-of-experts model (moe_layers_of.h: the CPU's
  // moe_layers_cpu.h, the CUDA backend's runtime/cuda/moe_layers_cuda.h).
  using MoeLayers = typename MoeLayersOf<B>::type;
  static constexpr bool kRunsMoe = !std::is_same_v<MoeLayers, NoMoeLayers>;
  std::unique_ptr<MoeLayers> moe;
  // Fully sharded data parallelism (fsdp_layers.h): the sharded layers (absent from
  // `layers`), and per (mb, layer, backward set) the gathered weights in the arena.
  FsdpSettings fsdp;
  std::map<int64_t, model_detail::FsdpLayer<B>> fsdp_layers;
  std::map<std::tuple<int64_t, int64_t, model_detail::FsdpUse>,
           std::unique_ptr<model_detail::FsdpGathered<B>>>
      fsdp_sets;
  void shard_layer(int64_t layer, const model_detail::HostLayer& host, int64_t dp_rank, int64_t dp);
  BasicBoundOp<B> bind_fsdp_op(const OpRef& ref, const std::string& op, bool repeated);
  void wrap_fsdp_layer_op(BasicBoundOp<B>& bound, const OpRef& ref, const std::string& op,
                          model_detail::FsdpUse use);
  /// The whole weights (mb, l) that ops of `use` read: with reshard_after_forward the
  /// forward and the backward gather their own, else the backward reads the forward's;
  /// full recompute's repeated forward gathers its own. The backward's set has the whole
  /// gradient.
  model_detail::FsdpGathered<B>& fsdp_gathered(int64_t mb, int64_t layer,
                                               model_detail::FsdpUse use) {
    using model_detail::FsdpUse;
    const model_detail::FsdpLayer<B>& sharded = fsdp_layers.at(layer);
    std::unique_ptr<model_detail::FsdpGathered<B>>& slot = fsdp_sets[{mb, layer, use}];
    if (slot) return *slot;
    slot = std::make_unique<model_detail::FsdpGathered<B>>();
    const int64_t padded = sharded.layout.padded();
    if (use == FsdpUse::kBackward && !fsdp.reshard_after_forward) {
      const model_detail::FsdpGathered<B>& kept = fsdp_gathered(mb, layer, FsdpUse::kForward);
      slot->weights = kept.weights;  // gathered once, kept
      slot->compute = kept.compute;
    } else {
      const SpanKind span =
          use == FsdpUse::kForward
              ? (fsdp.reshard_after_forward ? SpanKind::kLayerForward : SpanKind::kLayerSaved)
              : SpanKind::kLayerBackwardWeights;
      const std::string name = "fsdp.weights";
      slot->weights = arena.template allocate<float>({span, mb, layer}, name, padded, 0);
      if constexpr (model_detail::kFsdpComputeCopy<B>) {  // the GEMMs' copy (fsdp_layers.h)
        slot->compute = arena.template allocate<A>({span, mb, layer}, name + "_compute", padded, 0);
      } else {
        slot->compute = slot->weights;
      }
    }
    if (use == FsdpUse::kBackward) {
      slot->gradient = arena.template allocate<float>({SpanKind::kLayerBackward, mb, layer},
                                                      "fsdp.gradient", padded, 0);
    }
    slot->params = model_detail::fsdp_tensor_views<B>(sharded.layout, slot->weights, slot->compute,
                                                      slot->gradient);
    return *slot;
  }

  A* boundary(std::map<Key, A*>& buffers, SpanKind kind, int64_t micro_batch, int64_t layer) {
    DHELIX_CHECK(micro_batch >= 0);
    A*& buffer = buffers[{micro_batch, layer}];
    if (buffer == nullptr) {
      // The plan counts a layer's input (Korthikanti's norm input), not residual gradients.
      buffer = arena.template allocate<A>({kind, micro_batch, layer}, "x", dims.residual_elements(),
                                          kind == SpanKind::kResidual && layer < dims.num_layers);
    }
    return buffer;
  }
  A* residual(int64_t mb, int64_t layer) {
    DHELIX_CHECK(layer >= 0 && layer <= dims.num_layers);
    return boundary(residuals, SpanKind::kResidual, mb, layer);
  }
  A* residual_grad(int64_t mb, int64_t layer) {
    DHELIX_CHECK(layer >= -1 && layer < dims.num_layers);
    return boundary(residual_grads, SpanKind::kResidualGrad, mb, layer);
  }
  /// The arena's buffers of one (micro-batch, layer) or stage extra; `prefix` keeps apart
  /// the names of the states that share a span (the recompute state's "re.").
  struct LayerAllocator {
    Impl& m;
    int64_t mb = 0;
    int64_t layer = -1;
    std::string prefix;
    /// 1 / the share of what is allocated the plan's activation model counts
    /// (memory_report.h's counted_bytes): saved spans and the head wholly; what sets this
    /// (the recompute state's copy of the saved activations, the gathered inputs under
    /// SP); 0: none.
    int64_t counted_share = 0;
    template <class T>
    T* allocate(SpanKind kind, std::string_view name, int64_t count, bool uncounted = false) {
      const bool always = kind == SpanKind::kLayerSaved;
      const int64_t share = uncounted ? 0 : counted_share > 0 ? counted_share : always ? 1 : 0;
      return m.arena.template allocate<T>({kind, mb, layer}, prefix + std::string(name), count,
                                          share);
    }
    A* act(SpanKind kind, std::string_view name, int64_t count) {
      return allocate<A>(kind, name, count);
    }
    float* f32(SpanKind kind, std::string_view name, int64_t count) {
      return allocate<float>(kind, name, count);
    }
    /// Per-row statistics (rstd, lse): Korthikanti's count leaves them out, as the plan.
    float* stat(SpanKind kind, std::string_view name, int64_t count) {
      return allocate<float>(kind, name, count, true);
    }
  };
  /// Which forward buffers live how long (allocate_forward): the plain forward keeps what
  /// the backward reads; under full recompute the forward keeps nothing (the backward reads
  /// the recompute state) and the recompute state lives in the backward; under selective
  /// recompute the forward drops the core attention's buffers the backward recomputes.
  enum class ForwardRole { kPlain, kFullRecomputeForward, kSelectiveForward, kRecompute };
  float* token_loss(int64_t mb) {
    float*& loss = token_losses[mb];
    if (loss == nullptr) loss = memory.template allocate<float>(dims.tokens);
    return loss;
  }
  /// Forgets every activation buffer and state (plan_activation_memory, after the layout).
  void drop_activation_states() {
    residuals.clear();
    residual_grads.clear();
    layer_states.clear();
    recompute_states.clear();
    embedding_states.clear();
    head_states.clear();
    cp_states.clear();
    recompute_cp_states.clear();
    hierarchical_views.clear();
    recompute_hierarchical_views.clear();
    fsdp_sets.clear();
    if constexpr (requires { moe->drop_states(); }) {
      if (moe) moe->drop_states();
    }
  }

  model_detail::TokenBuffers<B>& token_buffers(int64_t mb);
  model_detail::LayerState<B>& layer_state(int64_t mb, int64_t layer);
  model_detail::LayerState<B>& recompute_state(int64_t mb, int64_t layer);
  void allocate_forward(model_detail::LayerState<B>& s, LayerAllocator& a, ForwardRole role);
  void allocate_backward(model_detail::LayerState<B>& s, LayerAllocator& a);
  model_detail::EmbeddingState<B>& embedding_state(int64_t mb);
  model_detail::CpLayerState<B>& cp_state(int64_t mb, int64_t layer, bool recomputing);
  // a2a+p2p: the ring's view of a layer, the whole CP layer seen by the ring across the
  // sub-groups (ring_dims: cp / A ranks holding A·T tokens of heads / A), and its state
  // (hierarchical_view: q, the head-split output, dO and d_qkv, lse), of the forward's
  // state or, with recompute, of the recompute state.
  model_detail::Dims ring_dims;
  std::map<Key, std::unique_ptr<model_detail::LayerState<B>>> hierarchical_views,
      recompute_hierarchical_views;
  model_detail::LayerState<B>& hierarchical_view(int64_t mb, int64_t layer, bool recomputing);
  model_detail::HeadState<B>& head_state(int64_t mb);
  BasicBoundOp<B> bind_extra_op(const OpRef& ref);
  // The counts of each bound all-to-all of equal blocks (layer_ops_ulysses.h): outside the
  // arena, since the collective reads and writes them in every iteration; one array per
  // (op, micro-batch, layer, recomputing), so no two ops share the receive half, made once
  // and found again when a run binds again.
  std::map<std::tuple<std::string, int64_t, int64_t, bool>, int64_t*> all_to_all_counts;
  model_detail::AllToAllCounts counts_for(const OpRef& ref, bool recomputing) {
    return [this, key = std::tuple{ref.op, ref.micro_batch, ref.layer, recomputing}](
               int64_t members, int64_t block) {
      int64_t*& counts = all_to_all_counts[key];
      if (counts == nullptr) {
        counts = memory.template allocate<int64_t>(2 * members);
        const std::vector<int64_t> host(static_cast<size_t>(2 * members), block);
        memory.upload(host.data(), counts, 2 * members);
      }
      return counts;
    };
  }
  void mark_loss_slot(int64_t mb) {
    if (static_cast<int64_t>(loss_ran.size()) <= mb) loss_ran.resize(static_cast<size_t>(mb + 1));
  }
};

template <class B>
model_detail::TokenBuffers<B>& BasicStageModel<B>::Impl::token_buffers(int64_t mb) {
  model_detail::TokenBuffers<B>& t = tokens[mb];
  if (t.tokens == nullptr) {
    t.tokens = memory.template allocate<int64_t>(dims.tokens);
    t.targets = memory.template allocate<int64_t>(dims.tokens);
    t.host_targets.assign(static_cast<size_t>(dims.tokens), -1);
    memory.upload(t.host_targets.data(), t.targets, dims.tokens);
  }
  return t;
}

template <class B>
model_detail::LayerState<B>& BasicStageModel<B>::Impl::layer_state(int64_t mb, int64_t layer) {
  std::unique_ptr<model_detail::LayerState<B>>& slot = layer_states[{mb, layer}];
  if (slot) return *slot;
  slot = std::make_unique<model_detail::LayerState<B>>();
  model_detail::LayerState<B>& s = *slot;
  s.x = residual(mb, layer);
  s.out = residual(mb, layer + 1);
  s.dout = residual_grad(mb, layer);
  s.dx = residual_grad(mb, layer - 1);
  LayerAllocator a{*this, mb, layer, ""};
  allocate_forward(s, a,
                   recompute == RecomputeGranularity::kFull ? ForwardRole::kFullRecomputeForward
                   : recompute == RecomputeGranularity::kSelective ? ForwardRole::kSelectiveForward
                                                                   : ForwardRole::kPlain);
  // Under full recompute every backward op reads the recompute state, which has its own;
  // selective recompute's copies these (bwd.proj_wgrad reads this state: bind's kept_output).
  if (recompute != RecomputeGranularity::kFull) allocate_backward(s, a);
  return s;
}

template <class B>
void BasicStageModel<B>::Impl::allocate_backward(model_detail::LayerState<B>& s,
                                                 LayerAllocator& a) {
  const model_detail::Dims& d = dims;
  const int64_t res = d.residual_elements(), full = d.full_elements(), t = d.tokens;
  // The MLP block's backward runs first; d_h1, its result, is what the attention block's
  // backward starts from.
  const SpanKind mlp = SpanKind::kMlpBackward, attn = SpanKind::kAttentionBackward;
  s.d_mlp_full = d.sp ? a.act(mlp, "d_mlp_full", full) : s.dout;
  s.d_act = a.act(mlp, "d_act", t * d.ffn);
  s.d_gate_up = a.act(mlp, "d_gate_up", t * 2 * d.ffn);
  s.d_mlp_in = a.act(mlp, "d_mlp_in", full);
  s.d_ln2_out = d.sp ? a.act(mlp, "d_ln2_out", res) : s.d_mlp_in;
  s.d_h1 = a.act(SpanKind::kLayerBackward, "d_h1", res);
  s.d_attn_full = d.sp ? a.act(attn, "d_attn_full", full) : s.d_h1;
  s.d_attn_out = a.act(attn, "d_attn_out", t * d.q_width);
  // Under CP the ring's state has its own dq, dK, dV and delta (layer_ops_cp.h).
  const bool ring = d.ring();
  s.dq = ring ? nullptr : a.act(attn, "dq", t * d.q_width);
  s.dk = ring ? nullptr : a.act(attn, "dk", t * d.kv_width);
  s.dv = ring ? nullptr : a.act(attn, "dv", t * d.kv_width);
  s.d_qkv = a.act(attn, "d_qkv", t * d.qkv_width);
  s.d_attn_in = a.act(attn, "d_attn_in", full);
  s.d_ln1_out = d.sp ? a.act(attn, "d_ln1_out", res) : s.d_attn_in;
  s.attn_delta = ring ? nullptr : a.stat(attn, "attn_delta", d.micro_batch * d.heads * d.seq_shard);
  if (d.kv_allgather) {
    s.kv_gathered_bwd = a.act(attn, "kv_gathered_bwd", d.cp * 2 * t * d.kv_width);
    s.dkv_shares = a.act(attn, "dkv_shares", d.cp * 2 * t * d.kv_width);
    s.dkv_mine = a.act(attn, "dkv_mine", 2 * t * d.kv_width);
  }
  if (d.hierarchical()) s.dqkv_heads = a.act(attn, "dqkv_heads", t * d.qkv_width);
  if (d.ulysses || d.hierarchical()) {
    s.d_out_heads = a.act(attn, "d_out_heads", t * d.q_width);
    s.a2a_send_bwd = a.act(attn, "a2a_send_bwd", t * d.qkv_width);
    s.a2a_recv_bwd = a.act(attn, "a2a_recv_bwd", t * d.qkv_width);
  }
}

// The forward's buffers. Saved (read by the backward: layer_ops_backward.h): the norms'
// rstd, the GEMM inputs attn_in and mlp_in (== the norm outputs without SP), q, k, v, the
// attention output and lse, h1, gate_up and act. The rest (qkv, the GEMM outputs, the
// sharded norm outputs and branches under SP) die with the layer's forward.
template <class B>
void BasicStageModel<B>::Impl::allocate_forward(model_detail::LayerState<B>& s, LayerAllocator& a,
                                                ForwardRole role) {
  const model_detail::Dims& d = dims;
  const int64_t res = d.residual_elements(), full = d.full_elements(), t = d.tokens;
  // Temporaries die with their block's forward (recomputed: with the repeated forward).
  // What the backward reads lives from the forward to the backward; under full recompute
  // the forward keeps none of it (each block's dies with the block's forward, h1 with the
  // layer's) and the recompute state's lives in the backward block that reads it.
  SpanKind attn_temp = SpanKind::kAttentionForward, mlp_temp = SpanKind::kMlpForward;
  SpanKind attn_saved = SpanKind::kLayerSaved, mlp_saved = SpanKind::kLayerSaved;
  SpanKind h1_span = SpanKind::kLayerSaved;
  if (role == ForwardRole::kFullRecomputeForward) {
    attn_saved = SpanKind::kAttentionForward;
    mlp_saved = SpanKind::kMlpForward;
    h1_span = SpanKind::kLayerForward;
  } else if (role == ForwardRole::kRecompute) {
    attn_temp = mlp_temp = SpanKind::kRecomputeForward;
    attn_saved = SpanKind::kAttentionBackward;
    mlp_saved = SpanKind::kMlpBackward;
    h1_span = SpanKind::kLayerBackward;
  }
  // Selective recompute repeats the core attention: its q (but under the ring's and
  // allgather's CP, where gemm_qkv makes q: gemm_splits), k, v and lse are the recompute
  // state's; the output stays saved for bwd.proj_wgrad (bind's kept_output).
  const bool selective = role == ForwardRole::kSelectiveForward;
  const bool gemm_splits = d.ring() || d.kv_allgather;
  const SpanKind core = selective ? SpanKind::kAttentionForward : attn_saved;
  // What the plan counts (memory_report.h): the saved activations, and the repeated
  // forward's (the plan's recompute transient), not temporaries; under SP `share` = tp
  // for the gathered GEMM inputs (the plan counts the sharded one Megatron keeps).
  const auto saved_act = [&](SpanKind kind, std::string_view name, int64_t count,
                             int64_t share = 1) {
    if (role == ForwardRole::kRecompute || kind == SpanKind::kLayerSaved) a.counted_share = share;
    A* buffer = a.act(kind, name, count);
    a.counted_share = 0;
    return buffer;
  };
  s.ln1_out = d.sp ? a.act(attn_temp, "ln1_out", res) : saved_act(attn_saved, "ln1_out", res);
  s.ln1_rstd = a.stat(attn_saved, "ln1_rstd", d.rows);
  s.attn_in = d.sp ? saved_act(attn_saved, "attn_in", full, d.tp) : s.ln1_out;
  // Selective recompute repeats the core attention from the fused QKV output: it is saved
  // (Megatron keeps the core attention's input), the split q, k, v are not (with a2a the
  // repeated qkv_a2a splits it again). Under the ring's and allgather's CP the repeated
  // attention reads gemm_qkv's q and K/V block instead.
  s.qkv = selective && !gemm_splits ? saved_act(SpanKind::kLayerSaved, "qkv", t * d.qkv_width)
                                    : a.act(attn_temp, "qkv", t * d.qkv_width);
  s.q = saved_act(selective && !gemm_splits ? core : attn_saved, "q", t * d.q_width);
  // Under CP the ring's own block (cp.kv0, layer_ops_cp.h) holds K and V.
  s.k = !d.ring() ? saved_act(core, "k", t * d.kv_width) : nullptr;
  s.v = !d.ring() ? saved_act(core, "v", t * d.kv_width) : nullptr;
  s.attn_out = saved_act(attn_saved, "attn_out", t * d.q_width);
  s.lse = a.stat(core, "lse", d.micro_batch * d.heads * d.seq_shard);
  if (d.kv_allgather) {  // this rank's K/V block (the backward gathers it again), the blocks
    s.kv_local = saved_act(attn_saved, "kv_local", 2 * t * d.kv_width);
    s.kv_gathered = a.act(attn_temp, "kv_gathered", d.cp * 2 * t * d.kv_width);
  }
  if (d.ulysses || d.hierarchical()) {  // the head-split output, the all-to-alls' blocks
    s.attn_out_heads = saved_act(core, "attn_out_heads", t * d.q_width);
    s.a2a_send = a.act(attn_temp, "a2a_send", t * d.qkv_width);
    s.a2a_recv = a.act(attn_temp, "a2a_recv", t * d.qkv_width);
  }
  s.proj_out = a.act(attn_temp, "proj_out", full);
  s.attn_branch = d.sp ? a.act(attn_temp, "attn_branch", res) : s.proj_out;
  s.h1 = saved_act(h1_span, "h1", res);
  // A MoE MLP reads its input rows (ln2_out, sharded under SP) in its backward too.
  s.ln2_out = d.sp && !moe ? a.act(mlp_temp, "ln2_out", res) : saved_act(mlp_saved, "ln2_out", res);
  s.ln2_rstd = a.stat(mlp_saved, "ln2_rstd", d.rows);
  // A MoE layer has no dense FC1 to gather for: its router and permute read ln2_out.
  s.mlp_in = d.sp && !moe ? saved_act(mlp_saved, "mlp_in", full, d.tp) : s.ln2_out;
  s.gate_up = saved_act(mlp_saved, "gate_up", t * 2 * d.ffn);
  s.act = saved_act(mlp_saved, "act", t * d.ffn);
  s.fc2_out = a.act(mlp_temp, "fc2_out", full);
  s.mlp_branch = d.sp ? a.act(mlp_temp, "mlp_branch", res) : s.fc2_out;
}

// A copy of the stored state whose recomputed activations live in buffers of their own:
// full recompute repeats every forward op of the layer, so every forward buffer is new
// (the repeated bda_mlp writes a scratch copy of the layer's output, which the next layer
// already consumed); selective recompute repeats the core attention (fwd.flash_attn:
// split, RoPE, attention), so q, k, v, the output and lse are new; with a2a and a2a+p2p
// also the all-to-alls' blocks and the head-split output (the repeated qkv_a2a writes q, k,
// v, or q and the ring's own block), with allgather the gathered K/V (q and this rank's
// block are gemm_qkv's, kept). A backward that ran without its recompute would read
// buffers no forward wrote.
template <class B>
model_detail::LayerState<B>& BasicStageModel<B>::Impl::recompute_state(int64_t mb, int64_t layer) {
  std::unique_ptr<model_detail::LayerState<B>>& slot = recompute_states[{mb, layer}];
  if (slot) return *slot;
  slot = std::make_unique<model_detail::LayerState<B>>(layer_state(mb, layer));
  model_detail::LayerState<B>& s = *slot;
  const model_detail::Dims& d = dims;
  LayerAllocator a{*this, mb, layer, "re."};
  const SpanKind attn = SpanKind::kAttentionBackward;  // selective: the attention block's
  if (recompute == RecomputeGranularity::kFull) {
    allocate_forward(s, a, ForwardRole::kRecompute);
    s.out = a.act(SpanKind::kRecomputeForward, "out", d.residual_elements());
  } else {
    // Under the ring's and allgather's CP, q is split and rotated by fwd.gemm_qkv, which
    // selective recompute keeps.
    const bool gemm_splits = d.ring() || d.kv_allgather;
    const int64_t t = d.tokens;
    if (!gemm_splits) s.q = a.act(attn, "q", t * d.q_width);
    if (!gemm_splits && !d.hierarchical()) s.k = a.act(attn, "k", t * d.kv_width);
    if (!gemm_splits && !d.hierarchical()) s.v = a.act(attn, "v", t * d.kv_width);
    s.attn_out = a.act(attn, "attn_out", t * d.q_width);
    s.lse = a.stat(attn, "lse", d.micro_batch * d.heads * d.seq_shard);
    if (d.kv_allgather) s.kv_gathered = a.act(attn, "kv_gathered", d.cp * 2 * t * d.kv_width);
    if (d.ulysses || d.hierarchical()) {
      s.attn_out_heads = a.act(attn, "attn_out_heads", t * d.q_width);
      s.a2a_send = a.act(attn, "a2a_send", t * d.qkv_width);
      s.a2a_recv = a.act(attn, "a2a_recv", t * d.qkv_width);
    }
  }
  if (recompute == RecomputeGranularity::kFull) allocate_backward(s, a);
  return s;
}

// The ring's buffers of a CP layer. The recomputing state (the repeated ring's and the
// backward's) is a set of its own; under selective recompute fwd.gemm_qkv is not repeated,
// so its rotated K, V block (kv[0]) is the forward's, as its q is (recompute_state), but
// under a2a+p2p, where the repeated fwd.qkv_a2a writes the block again.
template <class B>
model_detail::CpLayerState<B>& BasicStageModel<B>::Impl::cp_state(int64_t mb, int64_t layer,
                                                                  bool recomputing) {
  std::unique_ptr<model_detail::CpLayerState<B>>& slot =
      (recomputing ? recompute_cp_states : cp_states)[{mb, layer}];
  if (slot) return *slot;
  // Without recompute one state holds both rings; with it the forward's state holds the
  // forward ring only and the recomputing state both (the repeated forward ring and the
  // backward's), its own block shared with the forward's under selective recompute.
  model_detail::CpStateParts parts;
  const bool full = recompute == RecomputeGranularity::kFull;
  const bool block_recomputed = full || dims.hierarchical();
  if (recompute != RecomputeGranularity::kNone && !recomputing) {
    parts.backward = false;
    if (block_recomputed) parts.own_block_span = SpanKind::kAttentionForward;
  } else if (recomputing) {
    parts.own_block = block_recomputed;
    parts.own_block_span = parts.forward_span = SpanKind::kAttentionBackward;
  }
  // All-gather CP (layer_ops_kv_allgather.h) takes the forward's online-softmax state only:
  // its blocks are the gathered buffer, its backward buffers the layer state's.
  if (dims.kv_allgather) parts.blocks = parts.backward = false;
  LayerAllocator a{*this, mb, layer, recomputing ? "re." : ""};
  slot = model_detail::make_cp_state<B>(a, dims.hierarchical() ? ring_dims : dims, parts);
  if (recomputing && !block_recomputed && parts.blocks) {
    slot->kv[0] = cp_state(mb, layer, false).kv[0];
  }
  return *slot;
}

template <class B>
model_detail::EmbeddingState<B>& BasicStageModel<B>::Impl::embedding_state(int64_t mb) {
  std::unique_ptr<model_detail::EmbeddingState<B>>& slot = embedding_states[mb];
  if (slot) return *slot;
  slot = std::make_unique<model_detail::EmbeddingState<B>>();
  model_detail::EmbeddingState<B>& s = *slot;
  LayerAllocator a{*this, mb, -1, ""};
  s.out = residual(mb, 0);
  s.partial = dims.sp ? a.act(SpanKind::kEmbeddingForward, "partial", dims.full_elements()) : s.out;
  s.dout = residual_grad(mb, -1);
  s.dout_full =
      dims.sp ? a.act(SpanKind::kEmbeddingBackward, "dout_full", dims.full_elements()) : s.dout;
  return s;
}

template <class B>
model_detail::HeadState<B>& BasicStageModel<B>::Impl::head_state(int64_t mb) {
  std::unique_ptr<model_detail::HeadState<B>>& slot = head_states[mb];
  if (slot) return *slot;
  slot = std::make_unique<model_detail::HeadState<B>>();
  model_detail::HeadState<B>& s = *slot;
  const model_detail::Dims& d = dims;
  const int64_t stats = d.tokens * cpu::kVocabStatsPerRow;
  // The head runs forward and backward as one task (the loss's micro-batch), so its buffers
  // share one span.
  LayerAllocator a{*this, mb, -1, ""};
  const SpanKind k = SpanKind::kHead;
  s.x = residual(mb, d.num_layers);
  s.dx = residual_grad(mb, d.num_layers - 1);
  s.norm_out = a.act(k, "norm_out", d.residual_elements());
  s.norm_rstd = a.f32(k, "norm_rstd", d.rows);
  s.head_in = d.sp ? a.act(k, "head_in", d.full_elements()) : s.norm_out;
  // The plan counts the logits and their fp32 softmax (planner/memory_model.h's
  // head_loss_transient_bytes): here the logits and their gradient.
  a.counted_share = 1;
  s.logits = a.act(k, "logits", d.tokens * d.vocab_local);
  s.dlogits = a.act(k, "dlogits", d.tokens * d.vocab_local);
  a.counted_share = 0;
  s.stats_local = a.f32(k, "stats_local", stats);
  s.stats_all = d.tp > 1 ? a.f32(k, "stats_all", d.tp * stats) : s.stats_local;
  s.lse = a.f32(k, "lse", d.tokens);
  s.token_loss = token_loss(mb);
  s.d_head_in = a.act(k, "d_head_in", d.full_elements());
  s.d_norm_out = d.sp ? a.act(k, "d_norm_out", d.residual_elements()) : s.d_head_in;
  return s;
}

template <class B>
model_detail::LayerState<B>& BasicStageModel<B>::Impl::hierarchical_view(int64_t mb, int64_t layer,
                                                                         bool recomputing) {
  std::unique_ptr<model_detail::LayerState<B>>& slot =
      (recomputing ? recompute_hierarchical_views : hierarchical_views)[{mb, layer}];
  if (slot) return *slot;
  const model_detail::LayerState<B>& s =
      recomputing ? recompute_state(mb, layer) : layer_state(mb, layer);
  slot = std::make_unique<model_detail::LayerState<B>>(s);
  slot->attn_out = s.attn_out_heads;
  slot->d_attn_out = s.d_out_heads;
  slot->d_qkv = s.dqkv_heads;
  return *slot;
}

}  // namespace dhelix::rt
