#include "runtime/memory/buffer_spans.h"

#include <fmt/format.h>

#include <algorithm>

#include "lib/error.h"

namespace dhelix::rt {

std::string span_name(const SpanKey& key) {
  const std::string mb = fmt::format("mb{}", key.micro_batch);
  switch (key.kind) {
    case SpanKind::kLayerForward:
      return fmt::format("{}.L{}.forward", mb, key.layer);
    case SpanKind::kLayerSaved:
      return fmt::format("{}.L{}.saved", mb, key.layer);
    case SpanKind::kLayerBackward:
      return fmt::format("{}.L{}.backward", mb, key.layer);
    case SpanKind::kLayerBackwardWeights:
      return fmt::format("{}.L{}.backward_weights", mb, key.layer);
    case SpanKind::kAttentionForward:
      return fmt::format("{}.L{}.attention_forward", mb, key.layer);
    case SpanKind::kMlpForward:
      return fmt::format("{}.L{}.mlp_forward", mb, key.layer);
    case SpanKind::kMlpBackward:
      return fmt::format("{}.L{}.mlp_backward", mb, key.layer);
    case SpanKind::kAttentionBackward:
      return fmt::format("{}.L{}.attention_backward", mb, key.layer);
    case SpanKind::kRecomputeForward:
      return fmt::format("{}.L{}.recompute_forward", mb, key.layer);
    case SpanKind::kEmbeddingForward:
      return mb + ".embedding.forward";
    case SpanKind::kEmbeddingBackward:
      return mb + ".embedding.backward";
    case SpanKind::kHead:
      return mb + ".head";
    case SpanKind::kResidual:
      return fmt::format("{}.residual{}", mb, key.layer);
    case SpanKind::kResidualGrad:
      return fmt::format("{}.residual_grad{}", mb, key.layer);
  }
  return mb;
}

bool attention_block_op(std::string_view op) {
  return op.find("attn") != std::string_view::npos || op.find("qkv") != std::string_view::npos ||
         op.find("proj") != std::string_view::npos ||
         op.find("kv_sendrecv") != std::string_view::npos;
}

ProgramOrder::ProgramOrder(const std::vector<OrderedInstruction>& instructions) {
  const size_t n = instructions.size();
  stream_.assign(n, 0);
  std::array<int64_t, kMaxStreams> none;
  none.fill(-1);
  clock_.assign(n, none);
  std::array<int64_t, kMaxStreams> last_on = none;  // last instruction per stream so far
  for (size_t i = 0; i < n; ++i) {
    const int s = instructions[i].stream;
    DHELIX_CHECK(s >= 0 && s < kMaxStreams);
    stream_[i] = s;
    std::array<int64_t, kMaxStreams>& clock = clock_[i];
    // The previous instruction of the stream has finished, and all it knew finished.
    if (const int64_t previous = last_on[static_cast<size_t>(s)]; previous >= 0) {
      clock = clock_[static_cast<size_t>(previous)];
      clock[static_cast<size_t>(s)] = previous;
    }
    for (const int64_t p : instructions[i].waits) {
      DHELIX_CHECK(p >= 0 && static_cast<size_t>(p) < i);
      const auto& theirs = clock_[static_cast<size_t>(p)];
      for (size_t t = 0; t < clock.size(); ++t) clock[t] = std::max(clock[t], theirs[t]);
      const auto their_stream = static_cast<size_t>(stream_[static_cast<size_t>(p)]);
      clock[their_stream] = std::max(clock[their_stream], p);
    }
    last_on[static_cast<size_t>(s)] = static_cast<int64_t>(i);
  }
}

ProgramOrder ProgramOrder::sequential(int64_t count) {
  return ProgramOrder(std::vector<OrderedInstruction>(static_cast<size_t>(count)));
}

bool ProgramOrder::finished_before_start(int64_t a, int64_t b) const {
  const int sa = stream(a);
  if (sa == stream(b)) return a < b;
  return clock_[static_cast<size_t>(b)][static_cast<size_t>(sa)] >= a;
}

namespace {

// The spans an instruction may touch (the file comment's table, read from the op's side).
std::vector<SpanKey> spans_of(const Instruction& in, int64_t num_layers,
                              const ExtraOwnerOf& extra_owner) {
  const int64_t mb = in.micro_batch;
  if (in.kind == InstructionKind::kSend || in.kind == InstructionKind::kRecv) {
    return {{in.gradient ? SpanKind::kResidualGrad : SpanKind::kResidual, mb, in.layer}};
  }
  const bool backward = in.op.starts_with("bwd.");
  if (in.layer >= 0) {
    const int64_t l = in.layer;
    const bool attention = attention_block_op(in.op);
    if (!backward) {
      std::vector<SpanKey> spans{
          {SpanKind::kLayerForward, mb, l},
          {attention ? SpanKind::kAttentionForward : SpanKind::kMlpForward, mb, l},
          {SpanKind::kLayerSaved, mb, l},
          {SpanKind::kResidual, mb, l}};
      // The layer's output is written by its last op only (layer_ops_forward.h).
      if (in.op == "fwd.bda_mlp") spans.push_back({SpanKind::kResidual, mb, l + 1});
      return spans;
    }
    std::vector<SpanKey> spans{
        {SpanKind::kLayerSaved, mb, l},
        {SpanKind::kLayerBackward, mb, l},
        {attention ? SpanKind::kAttentionBackward : SpanKind::kMlpBackward, mb, l},
        {SpanKind::kResidual, mb, l},
        {SpanKind::kResidualGrad, mb, l},
        {SpanKind::kResidualGrad, mb, l - 1}};
    if (in.op.starts_with("bwd.recompute.")) spans.push_back({SpanKind::kRecomputeForward, mb, l});
    if (in.op != "bwd.fsdp_reduce_scatter")
      spans.push_back({SpanKind::kLayerBackwardWeights, mb, l});
    return spans;
  }
  if (extra_owner(in.op) == ExtraOwner::kEmbedding) {
    if (!backward) return {{SpanKind::kEmbeddingForward, mb, -1}, {SpanKind::kResidual, mb, 0}};
    return {{SpanKind::kEmbeddingBackward, mb, -1}, {SpanKind::kResidualGrad, mb, -1}};
  }
  std::vector<SpanKey> spans{{SpanKind::kHead, mb, -1}, {SpanKind::kResidual, mb, num_layers}};
  if (backward) spans.push_back({SpanKind::kResidualGrad, mb, num_layers - 1});
  return spans;
}

}  // namespace

std::map<SpanKey, SpanUses> span_uses(const RankProgram& program, const ProgramOrder& order,
                                      int64_t num_layers, const ExtraOwnerOf& extra_owner) {
  std::map<SpanKey, SpanUses> uses;
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    const auto position = static_cast<int64_t>(i);
    const auto s = static_cast<size_t>(order.stream(position));
    for (const SpanKey& key : spans_of(in, num_layers, extra_owner)) {
      SpanUses& u = uses[key];
      if (u.first < 0) u.first = position;
      u.last = position;
      if (u.first_on[s] < 0) u.first_on[s] = position;
      u.last_on[s] = position;
      if (in.kind == InstructionKind::kRecv) u.from_start = true;
    }
  }
  return uses;
}

bool ordered_before(const SpanUses& a, const SpanUses& b, const ProgramOrder& order) {
  if (b.from_start) return false;
  for (const int64_t first : b.first_on) {
    if (first < 0) continue;
    for (const int64_t last : a.last_on) {
      if (last >= 0 && !order.finished_before_start(last, first)) return false;
    }
  }
  return true;
}

}  // namespace dhelix::rt
