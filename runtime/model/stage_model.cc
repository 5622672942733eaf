// The model's pieces that do not depend on the backend: names, the supported-settings
// check, this rank's sizes, the op-id tables and the loss average. The backend-generic
// model is in stage_model_impl.h.

#include "runtime/model/stage_model.h"

#include <fmt/format.h>

#include <array>

#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kRingExchange:
      return "ring_exchange";
    case CollectiveKind::kAllToAllV:
      return "all_to_all_v";
  }
  return "?";
}

const char* element_type_name(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

namespace {

[[noreturn]] void throw_not_f32(const CollectiveRequest& request) {
  throw Error(ErrorCode::kInternal,
              fmt::format("{} of {} elements: the buffers are {}, this communicator takes float32",
                          collective_kind_name(request.kind), request.count,
                          element_type_name(request.element)));
}

}  // namespace

const float* CollectiveRequest::in_f32() const {
  if (element != ElementType::kFloat32) throw_not_f32(*this);
  return static_cast<const float*>(in);
}

float* CollectiveRequest::out_f32() const {
  if (element != ElementType::kFloat32) throw_not_f32(*this);
  return static_cast<float*>(out);
}

namespace model_detail {

void throw_wrong_mode(const std::string& op, const Dims& dims) {
  const std::string mode = dims.tp == 1 ? "tp = 1"
                                        : fmt::format("tp = {} {} sequence parallelism", dims.tp,
                                                      dims.sp ? "with" : "without");
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("StageModel: op {} does not occur in a layer with {}", op, mode));
}

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

}  // namespace

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

void check_context_parallel_supported(const JobSpec& job, ProblemList& problems);
// The MoE layers' limits on the CPU backend (moe_layers_cpu.h): a shared expert is split
// over TP without padding. (MoE under TP without SP is refused by the planner,
// lib/dag_builder.cc.)
void check_moe_supported(const JobSpec& job, ProblemList& problems) {
  const std::string yet = "is not run by the runtime yet";
  if (job.model.moe->shared_expert_ffn_hidden_size % job.parallel.tp != 0) {
    problems.add(job.model.source_file, "/moe/shared_expert_ffn_hidden_size",
                 std::to_string(job.model.moe->shared_expert_ffn_hidden_size),
                 yet + fmt::format(" with tp = {} (tp must divide it)", job.parallel.tp));
  }
}

// Settings the runtime does not run, as one Error(kUnsupported) listing all of them.
void check_supported(const JobSpec& job, bool runs_moe) {
  const ModelSpec& m = job.model;
  const std::string& file = m.source_file;
  ProblemList problems;
  const std::string yet = "is not run by the runtime yet";
  if (m.is_moe() && !runs_moe) {
    problems.add(file, "/moe", "mixture-of-experts",
                 yet + " on this backend (the CPU and CUDA backends only)");
  }
  if (m.is_moe() && runs_moe) check_moe_supported(job, problems);
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
  if (job.parallel.ep != 1 && !(m.is_moe() && runs_moe)) {
    const FieldOrigin origin = job.origin_of("parallel.ep");
    problems.add(origin.file, origin.pointer, std::to_string(job.parallel.ep), yet + " (1 only)");
  }
  check_context_parallel_supported(job, problems);
  problems.throw_if_any(ErrorCode::kUnsupported);
}

// Context parallelism runs with the load-balanced split (2·cp chunks of every sequence).
void check_context_parallel_supported(const JobSpec& job, ProblemList& problems) {
  const ParallelSpec& p = job.parallel;
  if (p.cp == 1) return;
  if (p.seq_length % (2 * p.cp) != 0) {
    const FieldOrigin seq = job.origin_of("parallel.seq_length");
    problems.add(seq.file, seq.pointer, std::to_string(p.seq_length),
                 fmt::format("is not a multiple of 2 x cp = {}: context parallelism gives each "
                             "CP rank two chunks of every sequence",
                             2 * p.cp));
  }
}

Dims make_dims(const JobSpec& job, int64_t rank) {
  // check_supported has refused what the model cannot split.
  DHELIX_CHECK(job.model.ffn_hidden_size % job.parallel.tp == 0 && job.model.head_dim % 2 == 0 &&
               job.parallel.seq_length % (2 * job.parallel.cp) == 0);
  Dims dims{rank_shape(job, rank)};
  dims.norm_eps = static_cast<float>(job.model.norm_epsilon());
  dims.rope_base = job.model.rope_theta();
  dims.cp_rank = Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).cp;
  dims.ulysses = job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kA2a;
  dims.kv_allgather = job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kAllGather;
  if (job.parallel.cp > 1 && job.parallel.cp_comm_type == CpCommType::kA2aP2p)
    dims.cp_a2a = job.parallel.cp_a2a_group();
  return dims;
}

bool is_embedding_op(const std::string& op) {
  return op == "fwd.embedding" || op == "fwd.reduce_scatter_embedding" ||
         op == "fwd.allreduce_embedding" || op == "bwd.allgather_embedding" ||
         op == "bwd.embedding";
}

bool is_head_op(const std::string& op) {
  for (const char* id : {"fwd.final_norm", "fwd.allgather_head", "fwd.head", "fwd.allreduce_loss",
                         "fwd.loss", "bwd.loss", "bwd.head_dgrad", "bwd.head_wgrad",
                         "bwd.reduce_scatter_head", "bwd.allreduce_head", "bwd.final_norm"}) {
    if (op == id) return true;
  }
  return false;
}

float mean_valid_loss(const std::vector<float>& token_loss, const std::vector<int64_t>& targets) {
  DHELIX_CHECK(token_loss.size() == targets.size());
  double sum = 0.0;
  int64_t valid = 0;
  for (size_t i = 0; i < token_loss.size(); ++i) {
    if (targets[i] < 0) continue;
    sum += token_loss[i];
    ++valid;
  }
  return valid == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(valid));
}

}  // namespace model_detail
}  // namespace dhelix::rt
