// Activation recompute in a layer's backward DAG (Megatron-LM's --recompute-granularity).
//
// A recomputed op is a copy of a forward op that runs in the backward strand: same kind,
// shape, pass (forward) and therefore the same signature and profiled time as the op it
// repeats; its id is "bwd.recompute." followed by the forward id without "fwd.". The copies
// come first in the new backward DAG (lowest indices, so the default topological order
// issues them first, as Megatron does) and keep the forward's edges among themselves.
//
//   full       every forward op is repeated. Megatron's checkpoint function re-runs the
//              layer's forward before autograd walks its backward, so every op of the
//              layer's backward that has no predecessor waits for the repeated forward's
//              last ops. The repeated all-gathers and reduce-scatters are TP traffic of the
//              backward strand; the repeated GEMMs are compute that the pairing search can
//              set beside the other strand's communication. Under FSDP (ZeRO-3) the
//              forward's parameter gathers are not repeated: the backward's gathers
//              (bwd.fsdp_gather, and bwd.fsdp_expert_gather for a mixture of experts) move
//              to the front and every copy of an op that read gathered weights waits for
//              them, as FSDP2 and Megatron-FSDP unshard once in the pre-backward hook and
//              the checkpoint's replay finds the weights whole. Without
//              reshard_after_forward there is no backward gather: the replay reads the
//              weights the forward gathered and kept.
//   selective  the core attention is repeated: the attention op (or the CP ring's steps,
//              exchanges and merge; with --cp-comm-type a2a, allgather or a2a+p2p also the
//              CP all-to-alls around it or the K/V all-gather before it: Megatron's
//              checkpoint wraps TE's DotProductAttention, and TE's AttnFuncWithCPAndQKVOA2A
//              and AttnFuncWithCPAndKVAllGather run those collectives inside it, so the
//              recomputed forward runs them again). Its inputs Q, K, V are kept from the
//              forward; Megatron
//              wraps the core attention in a checkpoint, whose backward re-runs it when
//              autograd reaches it, that is once the gradient of its output exists. So the
//              copies wait for the ops that the first attention-backward ops wait for (the
//              output projection's data gradient: bwd.proj_dgrad), and every
//              attention-backward op waits for the copies (it reads the recomputed output and
//              softmax statistics; with a2a the first is bwd.dout_a2a, with allgather
//              bwd.kv_allgather: the CP collectives that open the attention backward).
//              Left free, the copies could start anywhere in the
//              backward; with CP's ring that gave the backward 2.5 times the downsets
//              (Llama-3-70B, TP 8, CP 8: 2,498 against 1,002 when they wait; 298 without
//              recompute) and the pairing search minutes of work, for a freedom Megatron
//              does not have.
//
// Example, Llama with tp = 8 and SP, full: the 18-op backward becomes 32 ops, 14 copies
// (bwd.recompute.ln_attn .. bwd.recompute.bda_mlp) then bwd.bda_mlp, which now waits for
// bwd.recompute.bda_mlp.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/error.h"

namespace dhelix {
namespace {

// The all-to-alls of a2a and a2a+p2p and allgather's K/V all-gathers: TE runs them inside
// the core attention (the backward's dK/dV reduce-scatter follows the attention backward).
bool is_cp_collective(const Op& op) {
  return op.group == ParallelDim::kCp &&
         (op.kind == OpKind::kAllToAll || op.kind == OpKind::kAllGather);
}

bool is_core_attention(const Op& op) {
  return op.kind == OpKind::kAttention || op.kind == OpKind::kAttentionMerge ||
         (op.kind == OpKind::kSendRecv && op.group == ParallelDim::kCp) || is_cp_collective(op);
}

// An op of the attention backward that reads what the repeated core attention wrote (or, for
// the CP collectives, runs after it inside TE's backward): it waits for the copies.
bool reads_recomputed_attention(const Op& op) {
  return op.kind == OpKind::kAttention || is_cp_collective(op);
}

// FSDP's parameter all-gathers (lib/dag_builder_fsdp.cc): data-parallel, or for a
// mixture of experts' expert weights expert-data-parallel, all-gathers.
bool is_fsdp_gather(const Op& op) {
  return op.kind == OpKind::kAllGather && op.id.find("fsdp_") != std::string::npos;
}

// Full recompute under FSDP: the repeated forward reads the weights the backward's gather
// made (bwd.X for fwd.X) or, without reshard_after_forward, the forward's kept ones (no
// backward gather: no edge). Each copy of an op that waited for fwd.X waits for bwd.X.
void link_fsdp_gathers_to_copies(const LayerDag& forward, const std::vector<int64_t>& copies,
                                 LayerDag& backward) {
  for (int64_t f = 0; f < forward.size(); ++f) {
    const Op& gather = forward.op(f);
    if (!is_fsdp_gather(gather) || !gather.id.starts_with("fwd.")) continue;
    const std::optional<int64_t> b = backward.find("bwd." + gather.id.substr(4));
    if (!b) continue;
    for (int64_t s : forward.successors(f)) {
      if (copies[static_cast<size_t>(s)] >= 0)
        backward.add_edge(*b, copies[static_cast<size_t>(s)]);
    }
  }
}

std::string recompute_id(const std::string& forward_id) {
  const std::string stem = forward_id.starts_with("fwd.") ? forward_id.substr(4) : forward_id;
  return "bwd.recompute." + stem;
}

// Copies the forward ops `keep` selects into `out`; returns the copy's index per forward
// op (-1 where not copied) and the copies no other copy consumes.
std::vector<int64_t> copy_forward(const LayerDag& forward, const std::vector<bool>& keep,
                                  LayerDag& out, std::vector<int64_t>& sinks) {
  std::vector<int64_t> index(static_cast<size_t>(forward.size()), -1);
  for (int64_t v : forward.topological_order()) {
    if (!keep[static_cast<size_t>(v)]) continue;
    Op op = forward.op(v);
    op.id = recompute_id(op.id);
    const int64_t copy = out.add_op(std::move(op));
    index[static_cast<size_t>(v)] = copy;
    for (int64_t p : forward.predecessors(v)) {
      if (index[static_cast<size_t>(p)] >= 0) out.add_edge(index[static_cast<size_t>(p)], copy);
    }
  }
  for (int64_t v = 0; v < forward.size(); ++v) {
    if (index[static_cast<size_t>(v)] < 0) continue;
    bool consumed = false;
    for (int64_t s : forward.successors(v)) consumed |= index[static_cast<size_t>(s)] >= 0;
    if (!consumed) sinks.push_back(index[static_cast<size_t>(v)]);
  }
  return index;
}

// The ops the first attention-backward ops of `backward` wait for (those with no
// attention-backward op before them): what produces the gradient of the attention output.
std::vector<int64_t> output_gradient_ops(const LayerDag& backward) {
  std::vector<bool> after_attention(static_cast<size_t>(backward.size()), false);
  std::vector<int64_t> gradient;
  for (int64_t v : backward.topological_order()) {
    const bool attention = reads_recomputed_attention(backward.op(v));
    bool after = false;
    for (int64_t p : backward.predecessors(v))
      after = after || after_attention[static_cast<size_t>(p)];
    if (attention && !after) {
      for (int64_t p : backward.predecessors(v)) {
        if (std::find(gradient.begin(), gradient.end(), p) == gradient.end()) gradient.push_back(p);
      }
    }
    after_attention[static_cast<size_t>(v)] = after || attention;
  }
  std::sort(gradient.begin(), gradient.end());
  return gradient;
}

}  // namespace

LayerDags with_recompute(LayerDags dags, RecomputeGranularity granularity) {
  if (granularity == RecomputeGranularity::kNone) return dags;
  const bool full = granularity == RecomputeGranularity::kFull;
  const LayerDag& old = dags.backward;
  std::vector<bool> keep(static_cast<size_t>(dags.forward.size()));
  for (int64_t v = 0; v < dags.forward.size(); ++v) {
    const Op& op = dags.forward.op(v);
    keep[static_cast<size_t>(v)] = (full && !is_fsdp_gather(op)) || is_core_attention(op);
  }
  // FSDP's backward gathers come first (see the file comment), then the copies, then the
  // rest of the backward: `at` maps an old backward index to its new one.
  LayerDag backward;
  std::vector<int64_t> at(static_cast<size_t>(old.size()), -1);
  for (int64_t v = 0; v < old.size(); ++v) {
    if (is_fsdp_gather(old.op(v))) at[static_cast<size_t>(v)] = backward.add_op(old.op(v));
  }
  std::vector<int64_t> sinks;
  const std::vector<int64_t> copies = copy_forward(dags.forward, keep, backward, sinks);
  const int64_t offset = backward.size();
  for (int64_t v = 0; v < old.size(); ++v) {
    if (at[static_cast<size_t>(v)] < 0) at[static_cast<size_t>(v)] = backward.add_op(old.op(v));
  }
  link_fsdp_gathers_to_copies(dags.forward, copies, backward);
  for (int64_t v = 0; v < old.size(); ++v) {
    const int64_t to = at[static_cast<size_t>(v)];
    const std::vector<int64_t> preds = old.predecessors(v);
    for (int64_t p : preds) backward.add_edge(at[static_cast<size_t>(p)], to);
    const bool waits =
        full ? preds.empty() && !is_fsdp_gather(old.op(v)) : reads_recomputed_attention(old.op(v));
    if (!waits) continue;
    for (int64_t s : sinks) backward.add_edge(s, to);
  }
  if (!full) {
    for (int64_t g : output_gradient_ops(old)) {
      for (int64_t c = 0; c < offset; ++c) {
        if (backward.predecessors(c).empty() && !is_fsdp_gather(backward.op(c))) {
          backward.add_edge(at[static_cast<size_t>(g)], c);
        }
      }
    }
  }
  DHELIX_CHECK(backward.is_acyclic());
  dags.backward = std::move(backward);
  return dags;
}

}  // namespace dhelix
