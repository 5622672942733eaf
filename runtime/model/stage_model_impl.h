#pragma once
// BasicStageModel<B>'s definitions: construction, op binding and the activation layout of
// one rank's slice of the model, for any backend B (runtime/model/model_backend.h); its
// state and buffers are in stage_model_state.h. Included only by the files that
// instantiate the model for a backend (stage_model_cpu.cc, runtime/cuda/cuda_stage_model.cc).
// The ops themselves are in layer_ops_forward.h, layer_ops_backward.h and stage_ops.h; the
// initial values in parameter_init.cc.

#include <fmt/format.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/model/stage_model.h"
#include "runtime/model/stage_model_fsdp.h"
#include "runtime/model/stage_model_state.h"

namespace dhelix::rt {

template <class B>
BasicBoundOp<B> BasicStageModel<B>::Impl::bind_extra_op(const OpRef& ref) {
  const int64_t mb = ref.micro_batch;
  model_detail::ExtrasContext<B> context{dims};
  context.tokens = &token_buffers(mb);
  if (model_detail::is_embedding_op(ref.op)) {
    if (!embedding) {
      throw Error(
          ErrorCode::kInvalidInput,
          fmt::format("StageModel: rank {} does not hold the embedding (op {})", rank, ref.op));
    }
    context.embedding = &*embedding;
    context.embedding_state = &embedding_state(mb);
  } else if (model_detail::is_head_op(ref.op)) {
    if (!head) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: rank {} does not hold the head (op {})", rank, ref.op));
    }
    context.final_norm = &*final_norm;
    context.head = &*head;
    context.head_state = &head_state(mb);
    context.loss_scale = &loss_scale;
    mark_loss_slot(mb);
    context.loss_ran = &loss_ran;
    context.micro_batch = mb;
  } else {
    model_detail::throw_unknown_op(ref.op);
  }
  std::optional<BasicBoundOp<B>> bound = model_detail::bind_extra(ref.op, context);
  DHELIX_CHECK(bound.has_value());
  return std::move(*bound);
}

template <class B>
BasicStageModel<B>::BasicStageModel(const JobSpec& job, int64_t rank,
                                    std::vector<std::pair<int64_t, int64_t>> layer_ranges,
                                    bool embedding, bool head, uint64_t seed,
                                    typename B::MemoryConfig memory, FsdpSettings fsdp)
    : impl_(std::make_unique<Impl>(memory)) {
  using namespace model_detail;
  check_supported(job, Impl::kRunsMoe);
  if (fsdp.enabled) check_fsdp_supported(job);
  Impl& m = *impl_;
  m.fsdp = fsdp;
  m.recompute = job.parallel.recompute.granularity;
  m.dims = make_dims(job, rank);
  if (m.dims.hierarchical()) {  // the ring across the sub-groups (stage_model_state.h)
    model_detail::Dims& r = m.ring_dims;
    const int64_t a2a = m.dims.cp_a2a;
    r = m.dims;
    r.cp_a2a = 1;
    r.cp = m.dims.cp / a2a;
    r.cp_rank = m.dims.cp_rank / a2a;
    r.seq_shard *= a2a;
    r.tokens *= a2a;
    r.heads /= a2a;
    r.kv_heads /= a2a;
    r.q_width /= a2a;
    r.kv_width /= a2a;
    r.qkv_width /= a2a;
  }
  m.rank = rank;
  for (const auto& [first, count] : layer_ranges) {
    DHELIX_CHECK(first >= 0 && count >= 0 && first + count <= m.dims.num_layers);
    for (int64_t layer = first; layer < first + count; ++layer) {
      if (fsdp.enabled) {  // this rank's DP shard only (stage_model_fsdp.h)
        m.shard_layer(layer, make_layer_parameters(m.dims, layer, seed),
                      Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).dp,
                      job.parallel.dp);
        continue;
      }
      m.layers.emplace(layer, place_layer<B>(m.memory, make_layer_parameters(m.dims, layer, seed)));
    }
  }
  if constexpr (Impl::kRunsMoe) {
    if (job.model.is_moe()) {
      std::vector<int64_t> moe_layers;
      for (const auto& [layer, parameters] : m.layers) moe_layers.push_back(layer);
      m.moe = MoeLayersOf<B>::make(job, rank, moe_layers, seed, &m.loss_scale, m.memory);
      // The MoE layers' activations live in the arena too (moe_layers_cpu.h;
      // moe_padded_buffers.h).
      if constexpr (requires { m.moe->set_arena(&m.arena); }) {
        m.moe->set_arena(&m.arena);
      } else if constexpr (requires { m.moe->set_allocator({}); }) {
        m.moe->set_allocator([&m](SpanKind kind, int64_t mb, int64_t layer, std::string_view name,
                                  int64_t count, int64_t counted_share) {
          return m.arena.template allocate<float>({kind, mb, layer}, name, count, counted_share);
        });
      }
    }
  }
  if (embedding) m.embedding = place_parameter<B>(m.memory, make_embedding(m.dims, seed));
  if (head) {
    m.final_norm = place_parameter<B>(m.memory, make_final_norm(m.dims));
    m.head = place_parameter<B>(m.memory, make_head(m.dims, seed));
  }
  if constexpr (!model_detail::RingAttentionBackend<B>) {
    if (m.dims.cp > 1) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("StageModel: context parallelism (cp = {}) is not run by this "
                              "backend yet",
                              m.dims.cp));
    }
  }
  // The whole sequence's positions: a CP rank's chunks rotate at their global positions.
  m.rope.emplace(m.memory.rope(
      cpu::make_rope_table(m.dims.seq_shard * m.dims.cp, m.dims.head_dim, m.dims.rope_base)));
  m.loss_scale = 1.0f / static_cast<float>(m.dims.tokens);
  m.memory.synchronize();
}

template <class B>
BasicStageModel<B>::~BasicStageModel() = default;

template <class B>
void BasicStageModel<B>::set_tokens(int64_t micro_batch, MicroBatchTokens tokens) {
  const model_detail::Dims& d = impl_->dims;
  if (static_cast<int64_t>(tokens.tokens.size()) != d.tokens ||
      static_cast<int64_t>(tokens.targets.size()) != d.tokens) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: micro-batch {} has {} tokens and {} targets; "
                            "micro_batch_size x seq_length = {}",
                            micro_batch, tokens.tokens.size(), tokens.targets.size(), d.tokens));
  }
  std::vector<int64_t> wide_tokens(tokens.tokens.size());
  std::vector<int64_t> wide_targets(tokens.targets.size());
  for (size_t i = 0; i < tokens.tokens.size(); ++i) {
    const int32_t token = tokens.tokens[i], target = tokens.targets[i];
    if (token < 0 || token >= d.vocab || target >= d.vocab) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: micro-batch {} position {}: token {} / target {} "
                              "outside the vocabulary of {}",
                              micro_batch, i, token, target, d.vocab));
    }
    wide_tokens[i] = token;
    wide_targets[i] = target;
  }
  // Copied into the existing storage: bound closures keep reading it.
  model_detail::TokenBuffers<B>& t = impl_->token_buffers(micro_batch);
  impl_->memory.upload(wide_tokens.data(), t.tokens, d.tokens);
  impl_->memory.upload(wide_targets.data(), t.targets, d.tokens);
  t.host_targets = std::move(wide_targets);
}

template <class B>
BasicBoundOp<B> BasicStageModel<B>::bind(const OpRef& ref) {
  using namespace model_detail;
  Impl& m = *impl_;
  if (ref.micro_batch < 0) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("StageModel: op {}: micro-batch {} is negative", ref.op, ref.micro_batch));
  }
  if (ref.layer < 0) return m.bind_extra_op(ref);
  // bwd.recompute.X repeats fwd.X in the backward (lib/dag_builder_recompute.cc).
  const std::string_view recompute_prefix = "bwd.recompute.";
  const bool repeated = ref.op.starts_with(recompute_prefix);
  const std::string op = repeated ? "fwd." + ref.op.substr(recompute_prefix.size()) : ref.op;
  if constexpr (Impl::kRunsMoe) {
    if (m.moe && (Impl::MoeLayers::handles(op) || op == "bwd.ln_mlp")) {
      if (repeated && m.recompute == RecomputeGranularity::kNone) throw_unknown_op(ref.op);
      return bind_moe(ref);
    }
  }
  const bool sharded = m.fsdp_layers.contains(ref.layer);
  if (is_fsdp_op(op)) return m.bind_fsdp_op(ref, op, repeated);
  const bool cp_op = m.dims.ring() && (is_cp_op(op) || op == "fwd.gemm_qkv");
  const bool ulysses_op = m.dims.ulysses && is_ulysses_op(op);
  const bool allgather_op = m.dims.kv_allgather && is_kv_allgather_op(op);
  const bool hierarchical_op =
      m.dims.hierarchical() && (is_cp_op(op) || is_hierarchical_a2a_op(op));
  if ((!is_layer_op(op) && !cp_op && !ulysses_op && !allgather_op && !hierarchical_op) ||
      (repeated && m.recompute == RecomputeGranularity::kNone)) {
    throw_unknown_op(ref.op);
  }
  auto params = m.layers.find(ref.layer);
  if (params == m.layers.end() && !sharded) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: rank {} does not hold layer {} (op {})", m.rank, ref.layer,
                            ref.op));
  }
  // With recompute, the repeated forward ops and every backward op use the recompute state,
  // except the output projection's weight gradient under selective recompute: the plan
  // repeats the core attention for the attention backward only (lib/dag_builder_recompute.cc
  // gives bwd.proj_wgrad no edge from the repeated ops), so it reads the attention output
  // the forward kept, as Megatron's linear_proj keeps its input.
  const bool forward = op.starts_with("fwd.");
  const bool kept_output =
      m.recompute == RecomputeGranularity::kSelective && op == "bwd.proj_wgrad";
  const bool recomputing =
      m.recompute != RecomputeGranularity::kNone && (repeated || !forward) && !kept_output;
  // A sharded layer's ops read gathered weights: the forward's, or the backward's, which
  // full recompute's repeated forward reads too (fsdp_layers.h).
  const FsdpUse use = forward && !repeated ? FsdpUse::kForward : FsdpUse::kBackward;
  LayerParameters<B>& layer_params =
      sharded ? m.fsdp_gathered(ref.micro_batch, ref.layer, use).params : params->second;
  const LayerOpContext<B> context{m.dims, *m.rope, layer_params,
                                  recomputing ? m.recompute_state(ref.micro_batch, ref.layer)
                                              : m.layer_state(ref.micro_batch, ref.layer)};
  std::optional<BasicBoundOp<B>> bound;
  if (cp_op) {
    if constexpr (RingAttentionBackend<B>) {
      bound = bind_cp_op(
          op, CpOpContext<B>{context, m.cp_state(ref.micro_batch, ref.layer, recomputing)});
    }
    if (!bound) throw_unknown_op(ref.op);  // an index beyond the ring
  } else if (ulysses_op) {
    bound = bind_ulysses_op<B>(op, context, m.counts_for(ref, recomputing));
    if (!bound) throw_unknown_op(ref.op);
  } else if (allgather_op) {
    if constexpr (RingAttentionBackend<B>) {
      bound =
          bind_kv_allgather_op<B>(op, context, m.cp_state(ref.micro_batch, ref.layer, recomputing));
    }
    if (!bound) throw_unknown_op(ref.op);
  } else if (hierarchical_op) {
    if constexpr (RingAttentionBackend<B>) {
      model_detail::CpLayerState<B>& ring = m.cp_state(ref.micro_batch, ref.layer, recomputing);
      if (is_cp_op(op)) {
        const LayerOpContext<B> view{m.ring_dims, *m.rope, layer_params,
                                     m.hierarchical_view(ref.micro_batch, ref.layer, recomputing)};
        bound = bind_cp_op(op, CpOpContext<B>{view, ring});
      } else {
        bound = bind_hierarchical_a2a_op<B>(op, context, m.ring_dims, ring,
                                            m.counts_for(ref, recomputing));
      }
    }
    if (!bound) throw_unknown_op(ref.op);
  } else {
    bound = forward ? bind_layer_forward(op, context) : bind_layer_backward(op, context);
  }
  DHELIX_CHECK(bound.has_value());
  if (sharded) m.wrap_fsdp_layer_op(*bound, ref, op, use);
  return std::move(*bound);
}

// A MoE layer's MLP op: the experts' ops, and ln_mlp's backward preceded by the sum
// of the two input gradients the MoE backward leaves (permute's and the router's).
template <class B>
BasicBoundOp<B> BasicStageModel<B>::bind_moe(const OpRef& ref) {
  using namespace model_detail;
  Impl& m = *impl_;
  if constexpr (!Impl::kRunsMoe) {
    throw_unknown_op(ref.op);  // check_supported refused MoE on this backend
  } else {
    auto params = m.layers.find(ref.layer);
    if (params == m.layers.end()) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: rank {} does not hold layer {} (op {})", m.rank,
                              ref.layer, ref.op));
    }
    // As for the dense ops (bind): with recompute the repeated ops and the backward use the
    // recompute state. Only full recompute repeats the MoE MLP (selective repeats the core
    // attention), so only then do its own buffers have a recomputed set.
    const std::string_view recompute_prefix = "bwd.recompute.";
    const bool repeated = ref.op.starts_with(recompute_prefix);
    const std::string op = repeated ? "fwd." + ref.op.substr(recompute_prefix.size()) : ref.op;
    const bool recomputing =
        m.recompute != RecomputeGranularity::kNone && (repeated || !op.starts_with("fwd."));
    const bool moe_recomputing = recomputing && m.recompute == RecomputeGranularity::kFull;
    LayerState<B>& s = recomputing ? m.recompute_state(ref.micro_batch, ref.layer)
                                   : m.layer_state(ref.micro_batch, ref.layer);
    // The MoE MLP reads ln_mlp's rows and writes bda_mlp's (T / tp of them with SP: the
    // plan gathers nothing for it), and reads the residual gradient bda_mlp passes on.
    const typename MoeLayersOf<B>::Io io{
        .x = s.ln2_out, .y = s.mlp_branch, .dy = s.dout, .dx = s.d_ln2_out};
    if (op == "bwd.ln_mlp") {
      const LayerOpContext<B> context{m.dims, *m.rope, params->second, s};
      std::optional<BasicBoundOp<B>> norm = bind_layer_backward(op, context);
      DHELIX_CHECK(norm.has_value());
      norm->compute =
          [sum = m.moe->sum_input_gradient(ref.layer, ref.micro_batch, io, moe_recomputing),
           norm_backward = std::move(norm->compute)](const typename B::Exec& e) {
            sum(e);
            norm_backward(e);
          };
      return std::move(*norm);
    }
    std::optional<BasicBoundOp<B>> bound =
        m.moe->bind(op, ref.layer, ref.micro_batch, io, moe_recomputing);
    DHELIX_CHECK(bound.has_value());
    return std::move(*bound);
  }
}

template <class B>
void BasicStageModel<B>::plan_activation_memory(const std::vector<const RankProgram*>& programs,
                                                const std::vector<ProgramOrder>& orders) {
  Impl& m = *impl_;
  if (programs.empty() || m.arena.placed() || !activation_arena_wanted()) return;
  // Which buffers exist: bind every instruction once with fake addresses...
  m.arena.begin_layout();
  for (const RankProgram* program : programs) {
    for (const Instruction& in : program->instructions) {
      if (in.kind == InstructionKind::kSend || in.kind == InstructionKind::kRecv) {
        static_cast<void>(in.gradient ? m.residual_grad(in.micro_batch, in.layer)
                                      : m.residual(in.micro_batch, in.layer));
      } else {
        static_cast<void>(bind(
            OpRef{.op = std::string(in.op), .layer = in.layer, .micro_batch = in.micro_batch}));
      }
    }
  }
  // ...then place them, and forget the states that hold fake addresses: the executors' own
  // binding makes them again at their places.
  m.arena.place(programs, orders, m.dims.num_layers, [](std::string_view op) {
    return model_detail::is_embedding_op(std::string(op)) ? ExtraOwner::kEmbedding
                                                          : ExtraOwner::kHead;
  });
  m.drop_activation_states();
  // The tokens and losses (outside the arena) of every micro-batch now, not when the first
  // iteration gives its tokens: nothing is allocated once the activations are laid out.
  int64_t micro_batches = 0;
  for (const RankProgram* program : programs) {
    for (const Instruction& in : program->instructions) {
      micro_batches = std::max(micro_batches, in.micro_batch + 1);
    }
  }
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    static_cast<void>(m.token_buffers(mb));
    if (m.head) static_cast<void>(m.token_loss(mb));
  }
}

template <class B>
void BasicStageModel<B>::fill_memory_report(MemoryReport& report) const {
  impl_->arena.fill_report(report);
}

template <class B>
int64_t BasicStageModel<B>::boundary_elements() const {
  return impl_->dims.residual_elements();
}

template <class B>
typename B::Act* BasicStageModel<B>::residual(int64_t micro_batch, int64_t layer) {
  return impl_->residual(micro_batch, layer);
}

template <class B>
typename B::Act* BasicStageModel<B>::residual_grad(int64_t micro_batch, int64_t layer) {
  return impl_->residual_grad(micro_batch, layer);
}

template <class B>
std::vector<float> BasicStageModel<B>::micro_batch_losses() {
  Impl& m = *impl_;
  std::vector<float> losses(m.loss_ran.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> token_loss(static_cast<size_t>(m.dims.tokens));
  for (size_t mb = 0; mb < m.loss_ran.size(); ++mb) {
    if (!m.loss_ran[mb]) continue;
    const int64_t key = static_cast<int64_t>(mb);
    m.memory.download(m.token_losses.at(key), token_loss.data(), m.dims.tokens);
    losses[mb] = model_detail::mean_valid_loss(token_loss, m.tokens.at(key).host_targets);
  }
  return losses;
}

template <class B>
float BasicStageModel<B>::moe_aux_loss_sum(int64_t micro_batches) const {
  if constexpr (Impl::kRunsMoe) {
    if (impl_->moe) return impl_->moe->aux_loss_sum(micro_batches);
  }
  return 0.0f;
}

template <class B>
int64_t BasicStageModel<B>::moe_dropped_copies() const {
  if constexpr (Impl::kRunsMoe) {
    if (impl_->moe) return impl_->moe->dropped_copies();
  }
  return 0;
}

template <class B>
void BasicStageModel<B>::set_loss_scale(float scale) {
  impl_->loss_scale = scale;
}

template <class B>
std::vector<BasicParameterView<B>> BasicStageModel<B>::parameters() {
  std::vector<ParameterView> views;
  auto add = [&views](model_detail::Parameter<B>& p) {
    if (p.count == 0) return;  // a MoE model's dense MLP (no ffn_hidden_size)
    views.push_back(ParameterView{p.name, p.values, p.gradient, p.compute, p.count,
                                  p.sum_gradient_over_tp, false, false});
  };
  for (auto& [layer, p] : impl_->layers) {
    for (model_detail::Parameter<B>* tensor :
         {&p.ln_attn, &p.w_qkv, &p.w_proj, &p.ln_mlp, &p.w_fc1, &p.w_fc2}) {
      add(*tensor);
    }
    if constexpr (Impl::kRunsMoe) {
      if (impl_->moe) {
        for (const ParameterView& view : impl_->moe->parameters(layer)) views.push_back(view);
      }
    }
  }
  for (auto& [layer, sharded] : impl_->fsdp_layers) {
    typename B::Act* compute = nullptr;
    if constexpr (std::is_same_v<typename B::Act, float>) compute = sharded.values;
    views.push_back(ParameterView{sharded.name, sharded.values, sharded.gradient, compute,
                                  sharded.layout.shard(), false, false, true});
  }
  if (impl_->embedding) add(*impl_->embedding);
  if (impl_->final_norm) add(*impl_->final_norm);
  if (impl_->head) add(*impl_->head);
  return views;
}

template <class B>
void BasicStageModel<B>::refresh_compute_copies() {
  for (const ParameterView& view : parameters()) {
    // An FSDP shard on a bf16 backend has no copy: its gathers make one (fsdp_layers.h).
    if (view.compute == nullptr) continue;
    impl_->memory.refresh(view.values, view.compute, view.count);
  }
  impl_->memory.synchronize();
}

template <class B>
void BasicStageModel<B>::start_iteration(int64_t num_micro_batches) {
  DHELIX_CHECK(num_micro_batches >= 0);
  for (const ParameterView& view : parameters()) impl_->memory.zero(view.gradient, view.count);
  impl_->memory.synchronize();
  impl_->loss_ran.assign(static_cast<size_t>(num_micro_batches), 0);
}

}  // namespace dhelix::rt
