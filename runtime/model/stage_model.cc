// StageModel: the parameters, buffers and op binding of one rank's slice of the model.
// The ops themselves are in layer_ops_forward.cc, layer_ops_backward.cc and stage_ops.cc;
// the initialisation in parameter_init.cc.

#include "runtime/model/stage_model.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>

#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {

using namespace model_detail;

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
  }
  return "?";
}

namespace model_detail {

float* Arena::allocate(int64_t count) {
  DHELIX_CHECK(count >= 0);
  // Moving an inner vector when buffers_ grows keeps its heap block, so pointers stay valid.
  buffers_.emplace_back(static_cast<size_t>(count), 0.0f);
  return buffers_.back().data();
}

CollectiveRequest gather_rows(const Dims& dims, const float* in, float* out) {
  return CollectiveRequest{CollectiveKind::kAllGather, in, out, dims.residual_elements()};
}

CollectiveRequest scatter_rows(const Dims& dims, const float* in, float* out) {
  return CollectiveRequest{CollectiveKind::kReduceScatter, in, out, dims.residual_elements()};
}

CollectiveRequest reduce_in_place(const Dims& dims, float* inout) {
  return CollectiveRequest{CollectiveKind::kAllReduce, nullptr, inout, dims.full_elements()};
}

BoundOp communication(CollectiveRequest request) {
  BoundOp op;
  op.collective = request;
  return op;
}

BoundOp computation(std::function<void()> compute) {
  BoundOp op;
  op.compute = std::move(compute);
  return op;
}

void throw_wrong_mode(const std::string& op, const Dims& dims) {
  const std::string mode = dims.tp == 1 ? "tp = 1"
                                        : fmt::format("tp = {} {} sequence parallelism", dims.tp,
                                                      dims.sp ? "with" : "without");
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("StageModel: op {} does not occur in a layer with {}", op, mode));
}

}  // namespace model_detail

namespace {

// Every op id of a layer's DAGs in any TP mode (lib/dag_builder.cc).
constexpr std::array<const char*, 36> kLayerOps = {
    "fwd.ln_attn",        "fwd.allgather_attn",
    "fwd.gemm_qkv",       "fwd.flash_attn",
    "fwd.gemm_proj",      "fwd.reduce_scatter_attn",
    "fwd.allreduce_attn", "fwd.bda_attn",
    "fwd.ln_mlp",         "fwd.allgather_mlp",
    "fwd.gemm_fc1",       "fwd.swiglu",
    "fwd.gemm_fc2",       "fwd.reduce_scatter_mlp",
    "fwd.allreduce_mlp",  "fwd.bda_mlp",
    "bwd.bda_mlp",        "bwd.allgather_mlp",
    "bwd.fc2_dgrad",      "bwd.fc2_wgrad",
    "bwd.swiglu",         "bwd.fc1_dgrad",
    "bwd.fc1_wgrad",      "bwd.reduce_scatter_mlp",
    "bwd.allreduce_mlp",  "bwd.ln_mlp",
    "bwd.bda_attn",       "bwd.allgather_attn",
    "bwd.proj_dgrad",     "bwd.proj_wgrad",
    "bwd.flash_attn",     "bwd.qkv_dgrad",
    "bwd.qkv_wgrad",      "bwd.reduce_scatter_attn",
    "bwd.allreduce_attn", "bwd.ln_attn",
};

bool is_layer_op(const std::string& op) {
  for (const char* id : kLayerOps) {
    if (op == id) return true;
  }
  return false;
}

[[noreturn]] void throw_unknown_op(const std::string& op) {
  throw Error(ErrorCode::kUnsupported,
              fmt::format("StageModel: op {} is not implemented by the runtime's model", op));
}

// Settings the runtime does not run, as one Error(kUnsupported) listing all of them.
void check_supported(const JobSpec& job) {
  const ModelSpec& m = job.model;
  const std::string& file = m.source_file;
  ProblemList problems;
  const std::string yet = "is not run by the runtime yet";
  if (m.is_moe()) problems.add(file, "/moe", "mixture-of-experts", yet + " (dense MLPs only)");
  if (m.norm != NormKind::kRmsNorm) {
    problems.add(file, "/norm", norm_kind_name(m.norm), yet + " (rmsnorm only)");
  }
  if (m.activation != ActivationKind::kSwiGlu) {
    problems.add(file, "/activation", activation_kind_name(m.activation), yet + " (swiglu only)");
  }
  if (m.position != PositionKind::kRope) {
    problems.add(file, "/position", position_kind_name(m.position), yet + " (rope only)");
  }
  if (m.linear_bias) problems.add(file, "/linear_bias", "true", yet + " (no biases only)");
  if (m.tied_embeddings) {
    problems.add(file, "/tied_embeddings", "true", yet + " (untied embeddings only)");
  }
  if (m.ffn_hidden_size % job.parallel.tp != 0) {
    problems.add(file, "/ffn_hidden_size", std::to_string(m.ffn_hidden_size),
                 fmt::format("{} with tp = {} (tp must divide it)", yet, job.parallel.tp));
  }
  if (m.head_dim % 2 != 0) {
    problems.add(file, "/head_dim", std::to_string(m.head_dim), yet + " (RoPE needs it even)");
  }
  for (const auto& [field, value] :
       {std::pair{"parallel.cp", job.parallel.cp}, std::pair{"parallel.ep", job.parallel.ep}}) {
    if (value == 1) continue;
    const FieldOrigin origin = job.origin_of(field);
    problems.add(origin.file, origin.pointer, std::to_string(value), yet + " (1 only)");
  }
  problems.throw_if_any(ErrorCode::kUnsupported);
}

Dims make_dims(const JobSpec& job, int64_t rank) {
  const ModelSpec& m = job.model;
  const ParallelSpec& p = job.parallel;
  DHELIX_CHECK(p.tp >= 1 && m.num_attention_heads % p.tp == 0 && m.num_kv_heads % p.tp == 0 &&
               m.ffn_hidden_size % p.tp == 0 && m.head_dim % 2 == 0);
  Dims d;
  d.tp = p.tp;
  d.tp_rank = Placement(p, job.cluster.gpus_per_node).coordinates(rank).tp;
  d.sp = p.sp && p.tp > 1;
  d.batch = p.micro_batch_size;
  d.seq = p.seq_length;
  d.tokens = d.batch * d.seq;
  DHELIX_CHECK(!d.sp || d.tokens % d.tp == 0);
  d.rows = d.sp ? d.tokens / d.tp : d.tokens;
  d.hidden = m.hidden_size;
  d.head_dim = m.head_dim;
  d.heads = m.num_attention_heads / d.tp;
  d.kv_heads = m.num_kv_heads / d.tp;
  d.q_width = d.heads * d.head_dim;
  d.kv_width = d.kv_heads * d.head_dim;
  d.qkv_width = d.q_width + 2 * d.kv_width;
  d.ffn = m.ffn_hidden_size / d.tp;
  d.vocab = m.vocab_size;
  d.vocab_shard = (d.vocab + d.tp - 1) / d.tp;
  d.vocab_begin = std::min(d.vocab, d.tp_rank * d.vocab_shard);
  d.vocab_local = std::min(d.vocab_shard, d.vocab - d.vocab_begin);
  d.num_layers = m.num_layers;
  return d;
}

}  // namespace

struct StageModel::Impl {
  Dims dims;
  int64_t rank = 0;
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
  std::map<int64_t, LayerParameters> layers;  // by absolute layer index
  std::optional<Parameter> embedding, final_norm, head;
  cpu::RopeTable rope;
  float loss_scale = 1.0f;
  std::vector<float> losses;
  // Buffers, never freed or resized once created (closures hold their addresses).
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> residuals, residual_grads;
  std::map<int64_t, TokenBuffers> tokens;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<LayerState>> layer_states;
  std::map<int64_t, std::unique_ptr<EmbeddingState>> embedding_states;
  std::map<int64_t, std::unique_ptr<HeadState>> head_states;

  float* boundary(std::map<std::pair<int64_t, int64_t>, std::vector<float>>& buffers,
                  int64_t micro_batch, int64_t layer) {
    DHELIX_CHECK(micro_batch >= 0);
    std::vector<float>& buffer = buffers[{micro_batch, layer}];
    if (buffer.empty()) buffer.assign(static_cast<size_t>(dims.residual_elements()), 0.0f);
    return buffer.data();
  }
  float* residual(int64_t mb, int64_t layer) {
    DHELIX_CHECK(layer >= 0 && layer <= dims.num_layers);
    return boundary(residuals, mb, layer);
  }
  float* residual_grad(int64_t mb, int64_t layer) {
    DHELIX_CHECK(layer >= -1 && layer < dims.num_layers);
    return boundary(residual_grads, mb, layer);
  }

  TokenBuffers& token_buffers(int64_t mb) {
    TokenBuffers& t = tokens[mb];
    if (t.tokens.empty()) {
      t.tokens.assign(static_cast<size_t>(dims.tokens), 0);
      t.targets.assign(static_cast<size_t>(dims.tokens), -1);
    }
    return t;
  }

  LayerState& layer_state(int64_t mb, int64_t layer);
  EmbeddingState& embedding_state(int64_t mb);
  HeadState& head_state(int64_t mb);
  BoundOp bind_extra_op(const OpRef& ref);
};

LayerState& StageModel::Impl::layer_state(int64_t mb, int64_t layer) {
  std::unique_ptr<LayerState>& slot = layer_states[{mb, layer}];
  if (slot) return *slot;
  slot = std::make_unique<LayerState>();
  LayerState& s = *slot;
  Arena& a = s.arena;
  const Dims& d = dims;
  const int64_t res = d.residual_elements(), full = d.full_elements(), t = d.tokens;
  s.x = residual(mb, layer);
  s.out = residual(mb, layer + 1);
  s.dout = residual_grad(mb, layer);
  s.dx = residual_grad(mb, layer - 1);
  // Forward.
  s.ln1_out = a.allocate(res);
  s.ln1_rstd = a.allocate(d.rows);
  s.attn_in = d.sp ? a.allocate(full) : s.ln1_out;
  s.qkv = a.allocate(t * d.qkv_width);
  s.q = a.allocate(t * d.q_width);
  s.k = a.allocate(t * d.kv_width);
  s.v = a.allocate(t * d.kv_width);
  s.attn_out = a.allocate(t * d.q_width);
  s.lse = a.allocate(d.batch * d.heads * d.seq);
  s.proj_out = a.allocate(full);
  s.attn_branch = d.sp ? a.allocate(res) : s.proj_out;
  s.h1 = a.allocate(res);
  s.ln2_out = a.allocate(res);
  s.ln2_rstd = a.allocate(d.rows);
  s.mlp_in = d.sp ? a.allocate(full) : s.ln2_out;
  s.gate_up = a.allocate(t * 2 * d.ffn);
  s.act = a.allocate(t * d.ffn);
  s.fc2_out = a.allocate(full);
  s.mlp_branch = d.sp ? a.allocate(res) : s.fc2_out;
  // Backward.
  s.d_mlp_full = d.sp ? a.allocate(full) : s.dout;
  s.d_act = a.allocate(t * d.ffn);
  s.d_gate_up = a.allocate(t * 2 * d.ffn);
  s.d_mlp_in = a.allocate(full);
  s.d_ln2_out = d.sp ? a.allocate(res) : s.d_mlp_in;
  s.d_h1 = a.allocate(res);
  s.d_attn_full = d.sp ? a.allocate(full) : s.d_h1;
  s.d_attn_out = a.allocate(t * d.q_width);
  s.dq = a.allocate(t * d.q_width);
  s.dk = a.allocate(t * d.kv_width);
  s.dv = a.allocate(t * d.kv_width);
  s.d_qkv = a.allocate(t * d.qkv_width);
  s.d_attn_in = a.allocate(full);
  s.d_ln1_out = d.sp ? a.allocate(res) : s.d_attn_in;
  return s;
}

EmbeddingState& StageModel::Impl::embedding_state(int64_t mb) {
  std::unique_ptr<EmbeddingState>& slot = embedding_states[mb];
  if (slot) return *slot;
  slot = std::make_unique<EmbeddingState>();
  EmbeddingState& s = *slot;
  s.out = residual(mb, 0);
  s.partial = dims.sp ? s.arena.allocate(dims.full_elements()) : s.out;
  s.dout = residual_grad(mb, -1);
  s.dout_full = dims.sp ? s.arena.allocate(dims.full_elements()) : s.dout;
  return s;
}

HeadState& StageModel::Impl::head_state(int64_t mb) {
  std::unique_ptr<HeadState>& slot = head_states[mb];
  if (slot) return *slot;
  slot = std::make_unique<HeadState>();
  HeadState& s = *slot;
  Arena& a = s.arena;
  const Dims& d = dims;
  const int64_t stats = d.tokens * cpu::kVocabStatsPerRow;
  s.x = residual(mb, d.num_layers);
  s.dx = residual_grad(mb, d.num_layers - 1);
  s.norm_out = a.allocate(d.residual_elements());
  s.norm_rstd = a.allocate(d.rows);
  s.head_in = d.sp ? a.allocate(d.full_elements()) : s.norm_out;
  s.logits = a.allocate(d.tokens * d.vocab_local);
  s.stats_local = a.allocate(stats);
  s.stats_all = d.tp > 1 ? a.allocate(d.tp * stats) : s.stats_local;
  s.lse = a.allocate(d.tokens);
  s.token_loss = a.allocate(d.tokens);
  s.dlogits = a.allocate(d.tokens * d.vocab_local);
  s.d_head_in = a.allocate(d.full_elements());
  s.d_norm_out = d.sp ? a.allocate(d.residual_elements()) : s.d_head_in;
  return s;
}

BoundOp StageModel::Impl::bind_extra_op(const OpRef& ref) {
  const int64_t mb = ref.micro_batch;
  ExtrasContext context{dims};
  context.tokens = &token_buffers(mb);
  if (is_embedding_op(ref.op)) {
    if (!embedding) {
      throw Error(
          ErrorCode::kInvalidInput,
          fmt::format("StageModel: rank {} does not hold the embedding (op {})", rank, ref.op));
    }
    context.embedding = &*embedding;
    context.embedding_state = &embedding_state(mb);
  } else if (is_head_op(ref.op)) {
    if (!head) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: rank {} does not hold the head (op {})", rank, ref.op));
    }
    context.final_norm = &*final_norm;
    context.head = &*head;
    context.head_state = &head_state(mb);
    context.loss_scale = &loss_scale;
    if (static_cast<int64_t>(losses.size()) <= mb) {
      losses.resize(static_cast<size_t>(mb + 1), std::numeric_limits<float>::quiet_NaN());
    }
    context.losses = &losses;
    context.micro_batch = mb;
  } else {
    throw_unknown_op(ref.op);
  }
  std::optional<BoundOp> bound = bind_extra(ref.op, context);
  DHELIX_CHECK(bound.has_value());
  return std::move(*bound);
}

StageModel::StageModel(const JobSpec& job, int64_t rank,
                       std::vector<std::pair<int64_t, int64_t>> layer_ranges, bool embedding,
                       bool head, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  check_supported(job);
  Impl& m = *impl_;
  m.dims = make_dims(job, rank);
  m.rank = rank;
  m.layer_ranges = std::move(layer_ranges);
  for (const auto& [first, count] : m.layer_ranges) {
    DHELIX_CHECK(first >= 0 && count >= 0 && first + count <= m.dims.num_layers);
    for (int64_t layer = first; layer < first + count; ++layer) {
      m.layers.emplace(layer, make_layer_parameters(m.dims, layer, seed));
    }
  }
  if (embedding) m.embedding = make_embedding(m.dims, seed);
  if (head) {
    m.final_norm = make_final_norm(m.dims);
    m.head = make_head(m.dims, seed);
  }
  m.rope = cpu::make_rope_table(m.dims.seq, m.dims.head_dim, kRopeBase);
  m.loss_scale = 1.0f / static_cast<float>(m.dims.tokens);
}

StageModel::~StageModel() = default;

void StageModel::set_tokens(int64_t micro_batch, MicroBatchTokens tokens) {
  const Dims& d = impl_->dims;
  if (static_cast<int64_t>(tokens.tokens.size()) != d.tokens ||
      static_cast<int64_t>(tokens.targets.size()) != d.tokens) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: micro-batch {} has {} tokens and {} targets; "
                            "micro_batch_size x seq_length = {}",
                            micro_batch, tokens.tokens.size(), tokens.targets.size(), d.tokens));
  }
  TokenBuffers& t = impl_->token_buffers(micro_batch);
  for (size_t i = 0; i < tokens.tokens.size(); ++i) {
    const int32_t token = tokens.tokens[i], target = tokens.targets[i];
    if (token < 0 || token >= d.vocab || target >= d.vocab) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("StageModel: micro-batch {} position {}: token {} / target {} "
                              "outside the vocabulary of {}",
                              micro_batch, i, token, target, d.vocab));
    }
    t.tokens[i] = token;  // copied into the existing storage: bound closures keep reading it
    t.targets[i] = target;
  }
}

BoundOp StageModel::bind(const OpRef& ref) {
  Impl& m = *impl_;
  if (ref.micro_batch < 0) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("StageModel: op {}: micro-batch {} is negative", ref.op, ref.micro_batch));
  }
  if (ref.layer < 0) return m.bind_extra_op(ref);
  if (!is_layer_op(ref.op)) throw_unknown_op(ref.op);
  auto params = m.layers.find(ref.layer);
  if (params == m.layers.end()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: rank {} does not hold layer {} (op {})", m.rank, ref.layer,
                            ref.op));
  }
  const LayerOpContext context{m.dims, m.rope, params->second,
                               m.layer_state(ref.micro_batch, ref.layer)};
  std::optional<BoundOp> bound = ref.op.starts_with("fwd.") ? bind_layer_forward(ref.op, context)
                                                            : bind_layer_backward(ref.op, context);
  DHELIX_CHECK(bound.has_value());
  return std::move(*bound);
}

int64_t StageModel::boundary_elements() const { return impl_->dims.residual_elements(); }

float* StageModel::residual(int64_t micro_batch, int64_t layer) {
  return impl_->residual(micro_batch, layer);
}

float* StageModel::residual_grad(int64_t micro_batch, int64_t layer) {
  return impl_->residual_grad(micro_batch, layer);
}

const std::vector<float>& StageModel::micro_batch_losses() const { return impl_->losses; }

void StageModel::set_loss_scale(float scale) { impl_->loss_scale = scale; }

std::vector<ParameterView> StageModel::parameters() {
  std::vector<ParameterView> views;
  auto add = [&views](Parameter& p) {
    views.push_back(ParameterView{p.name, p.values.data(), p.gradient.data(),
                                  static_cast<int64_t>(p.values.size()), p.sum_gradient_over_tp});
  };
  for (auto& [layer, p] : impl_->layers) {
    for (Parameter* tensor : {&p.ln_attn, &p.w_qkv, &p.w_proj, &p.ln_mlp, &p.w_fc1, &p.w_fc2}) {
      add(*tensor);
    }
  }
  if (impl_->embedding) add(*impl_->embedding);
  if (impl_->final_norm) add(*impl_->final_norm);
  if (impl_->head) add(*impl_->head);
  return views;
}

void StageModel::start_iteration(int64_t num_micro_batches) {
  DHELIX_CHECK(num_micro_batches >= 0);
  for (ParameterView& view : parameters()) std::fill_n(view.gradient, view.count, 0.0f);
  impl_->losses.assign(static_cast<size_t>(num_micro_batches),
                       std::numeric_limits<float>::quiet_NaN());
}

}  // namespace dhelix::rt
