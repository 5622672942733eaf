#pragma once
// When an activation buffer is in use, derived once from the rank programs before the first
// step: the lifetimes the activation arena (arena_plan.h) packs.
//
// Spans. The model does not say op by op which buffer an op touches; it says, for each
// buffer it allocates, which part of the rank's work uses it (its span key):
//
//   span                      the instructions that may use it
//   layer_forward  (mb, l)    the forward ops of layer l for micro-batch mb
//   layer_saved    (mb, l)    the forward and the backward ops of (mb, l): what the backward
//                             reads of the forward (Megatron's saved tensors)
//   layer_backward (mb, l)    the backward ops of (mb, l), bwd.recompute.* included
//   backward_weights (mb, l)  the same but FSDP's reduce-scatter, which reads the gradient
//                             only: the layer's gathered weights (issued when the gradients
//                             are complete, it would hold them past the next layers' gathers)
//   attention_forward / mlp_forward / mlp_backward / attention_backward (mb, l)
//                             one half of the layer's forward or backward: the ops of the
//                             attention block (ln_attn to bda_attn, the CP ring) or of the
//                             MLP block (ln_mlp to bda_mlp, the MoE ops): a temporary of one
//                             half is dead before the other half runs
//   recompute_forward (mb, l) the bwd.recompute.* ops of (mb, l): the temporaries of the
//                             repeated forward
//   embedding_forward / _backward (mb), head (mb: forward and backward)
//   residual (mb, l)          the input of layer l: fwd.bda_mlp of l - 1 (the embedding for
//                             l = 0) that writes it, the forward and backward of l (the head
//                             for l = num_layers), and its pipeline transfers
//   residual_grad (mb, l)     the gradient of layer l's output: the backward of l + 1 (the
//                             head for l = num_layers - 1) that writes it, the backward of l
//                             (the embedding for l = -1), and its transfers
//
// A span's uses are summarised per stream: its first and last instruction on each. A span
// with a pipeline receive is live from the iteration's start: receives are posted before
// any work starts (runtime/exec/interpreter.h).
//
// Order. Two spans may share memory only if one's every use has finished before the
// other's first use starts, in every run of the program: that is, in the happens-before
// order the executors guarantee, not in program order. Co-executed, an instruction starts
// after the previous one on its stream has finished and after the producers of the events
// it waits for (runtime/exec/stream_lowering.h), transitively; ProgramOrder keeps, per
// instruction, the last position on each stream known finished when it starts (a vector
// clock). Sequential (dhelix-run --verify's reference) runs in program order on one thread.
// Example, streams compute (C) and local_comm (L): C0 A-writes, L1 reads A (waits on C0),
// C2 writes B. C2 does not wait on L1, so A and B overlap in time although A's last use is
// earlier in the program: they get different memory.

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lib/plan/rank_program.h"

namespace dhelix::rt {

enum class SpanKind : uint8_t {
  kLayerForward,
  kLayerSaved,
  kLayerBackward,
  kLayerBackwardWeights,
  kAttentionForward,
  kMlpForward,
  kMlpBackward,
  kAttentionBackward,
  kRecomputeForward,
  kEmbeddingForward,
  kEmbeddingBackward,
  kHead,
  kResidual,
  kResidualGrad,
};

struct SpanKey {
  SpanKind kind = SpanKind::kLayerForward;
  int64_t micro_batch = 0;
  int64_t layer = -1;  ///< layer spans and residuals; -1 otherwise (residual_grad: -1 valid)
  auto operator<=>(const SpanKey&) const = default;
};

/// "mb2.L5.saved", "mb0.residual4", "mb1.head", ...
std::string span_name(const SpanKey& key);

/// Whether a layer op (fwd.*, bwd.*, bwd.recompute.*) is of the attention block: its id
/// names attention, qkv, the projection or the CP ring's exchange (lib/dag_builder*.cc);
/// every other layer op is of the MLP block.
bool attention_block_op(std::string_view op);

/// What a stage-extra op (layer -1) belongs to; the model's classification
/// (model_detail::is_embedding_op / is_head_op).
enum class ExtraOwner { kEmbedding, kHead };
using ExtraOwnerOf = std::function<ExtraOwner(std::string_view op)>;

/// Streams an executor runs a program on, at most (runtime/exec/stream_lowering.h has 4).
inline constexpr int kMaxStreams = 4;

/// One instruction as an executor orders it: its stream, and the earlier instructions whose
/// completion it waits for besides its stream's previous one.
struct OrderedInstruction {
  int stream = 0;
  std::vector<int64_t> waits;
};

/// Happens-before over one program's instructions (see the file comment). The executors'
/// order comes from runtime/exec/stream_lowering.h's program_order().
class ProgramOrder {
 public:
  /// `instructions` in program order, which is the order they are enqueued in: every wait
  /// names an earlier instruction.
  explicit ProgramOrder(const std::vector<OrderedInstruction>& instructions);
  /// `count` instructions run one after another (the sequential mode).
  static ProgramOrder sequential(int64_t count);

  int64_t size() const { return static_cast<int64_t>(stream_.size()); }
  int stream(int64_t instruction) const { return stream_[static_cast<size_t>(instruction)]; }
  /// Whether instruction `a` has finished whenever instruction `b` starts.
  bool finished_before_start(int64_t a, int64_t b) const;

 private:
  std::vector<int> stream_;
  /// Per instruction, per stream: the last position on that stream finished when it starts
  /// (-1: none).
  std::vector<std::array<int64_t, kMaxStreams>> clock_;
};

/// One span's uses in one program.
struct SpanUses {
  bool from_start = false;  ///< a pipeline receive writes it
  int64_t first = -1;       ///< earliest and latest program position
  int64_t last = -1;
  std::array<int64_t, kMaxStreams> first_on{-1, -1, -1, -1};
  std::array<int64_t, kMaxStreams> last_on{-1, -1, -1, -1};
};

/// The uses of every span `program`'s instructions touch; `num_layers` of the model (the
/// head's input is residual num_layers).
std::map<SpanKey, SpanUses> span_uses(const RankProgram& program, const ProgramOrder& order,
                                      int64_t num_layers, const ExtraOwnerOf& extra_owner);

/// Whether every use of `a` finishes before any use of `b` starts, in every run.
bool ordered_before(const SpanUses& a, const SpanUses& b, const ProgramOrder& order);

}  // namespace dhelix::rt
