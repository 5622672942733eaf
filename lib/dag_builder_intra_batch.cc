// Intra-batch overlap (the paper's "Intra-batch" baseline, after MegaScale, Jiang et al.,
// NSDI 2024; DHelix paper sections 2.3 and 6.1): inside one micro-batch, the all-gather
// that feeds a column-parallel GEMM and the reduce-scatter that follows a row-parallel
// GEMM are decomposed into ring send/recv steps and GEMM chunks, so that communication of
// one shard overlaps computation on another. The rewrite starts from build_layer_dags and
// replaces each such (communication, GEMM) pair; nothing else changes.
//
// Worked example, tp = 2, Llama-3-70B, one sequence of 8192 tokens, SP: T = 8192 rows
// enter the GEMMs, each rank holds T/2 = 4096 rows of the residual stream.
//
//   all-gather -> GEMM (normal: ln_attn -> allgather_attn (128 MiB) -> gemm_qkv m 8192):
//
//     ln_attn ─┬─> allgather_attn.step1 ───────────> gemm_qkv.chunk1 ──> flash_attn
//              └─> gemm_qkv.chunk0 ──────────────────────┘
//
//     chunk0 (m 4096, n 5120, k 8192) multiplies the local shard at once; step1 (send/recv
//     of one shard, 4096 x 8192 bf16 = 64 MiB, to the next TP rank, the previous rank's
//     shard in return) runs beside it; chunk1 multiplies the received shard. With tp
//     ranks: steps 1 .. tp-1 in a chain (step s forwards the shard step s-1 received),
//     chunk c waits for step c and for chunk c-1 (one compute stream, issued in ring
//     order), so step s overlaps chunk s-1 and the last chunk runs alone.
//
//   GEMM -> reduce-scatter (normal: flash_attn -> gemm_proj m 8192 -> reduce_scatter_attn):
//
//     flash_attn ──> gemm_proj.chunk0 ─┬─> reduce_scatter_attn.step1 ──┬──> bda_attn
//                                      └─> gemm_proj.chunk1 ───────────┘
//
//     chunk0 (m 4096, n 8192, k 1024) computes the partial sums of the rows another rank
//     owns; step1 sends them on (64 MiB) while chunk1 computes the partial sums of this
//     rank's own rows; the consumer adds the received partial to its own. With tp ranks:
//     step s waits for chunk s-1 and step s-1 (it forwards the running sum with this
//     rank's partial added), chunk c waits for chunk c-1, and the consumer waits for the
//     last chunk and the last step, so step s overlaps chunk s and the first chunk runs
//     alone. The additions of running sums (tp-1 of T/tp x h elements) are folded into
//     the send/recv steps and the consumer: they are small memory-bound work.
//
// Per pair, 2 ops become 2·tp − 1, so a dense layer holds 14 + 4·(2·tp − 3) forward and
// 18 + 4·(2·tp − 3) backward ops (tp = 8: 66 and 70). The work is unchanged (tp chunks of
// m/tp rows do the flops of one m-row GEMM; the tp − 1 steps move what the ring collective
// moves), but each chunk is a smaller GEMM with its own signature, so the cost model
// charges its lower efficiency (launch, wave quantisation, size factor) and each step pays
// its own latency. Weight-gradient GEMMs stay whole: they read the full gathered input,
// so they wait for the last step of the gather (backward) or for the saved input.

#include "lib/dag_builder_intra_batch.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/dag_builder_internal.h"
#include "lib/error.h"

namespace dhelix {
namespace {

using namespace dag_detail;

// A (communication, GEMM) pair to decompose: for a gather, `first` is the all-gather and
// `second` the GEMM; for a scatter, `first` is the GEMM and `second` the reduce-scatter.
struct Pair {
  bool gather = true;
  int64_t first = 0;
  int64_t second = 0;
};

bool is_tp_collective(const Op& op, OpKind kind) {
  return op.kind == kind && op.group == ParallelDim::kTp;
}

// Expert tensor parallelism's all-gather (read by a grouped GEMM) and reduce-scatter (after
// one): these stay whole, as Megatron-Core runs them.
bool feeds_or_follows_grouped_gemm(const LayerDag& dag, int64_t v) {
  const auto grouped = [&](int64_t u) { return dag.op(u).kind == OpKind::kGroupedGemm; };
  const std::vector<int64_t> next = dag.successors(v);
  const std::vector<int64_t> prev = dag.predecessors(v);
  return std::any_of(next.begin(), next.end(), grouped) ||
         std::any_of(prev.begin(), prev.end(), grouped);
}

// The pairs of one DAG, keyed by their first op.
std::map<int64_t, Pair> find_pairs(const LayerDag& dag) {
  std::map<int64_t, Pair> pairs;
  for (int64_t v = 0; v < dag.size(); ++v) {
    const Op& op = dag.op(v);
    if (feeds_or_follows_grouped_gemm(dag, v)) continue;
    if (is_tp_collective(op, OpKind::kAllGather)) {
      int64_t gemm = -1;
      for (const int64_t s : dag.successors(v)) {
        const Op& next = dag.op(s);
        if (next.kind != OpKind::kGemm || next.gemm_role == GemmRole::kWgrad) continue;
        DHELIX_CHECK_MSG(gemm < 0, "two GEMMs read the all-gather " + op.id);
        gemm = s;
      }
      DHELIX_CHECK_MSG(gemm >= 0, "no GEMM reads the all-gather " + op.id);
      pairs[v] = Pair{true, v, gemm};
    } else if (is_tp_collective(op, OpKind::kReduceScatter)) {
      const std::vector<int64_t> producers = dag.predecessors(v);
      DHELIX_CHECK_MSG(producers.size() == 1 && dag.op(producers[0]).kind == OpKind::kGemm,
                       "the reduce-scatter " + op.id + " does not follow one GEMM");
      pairs[producers[0]] = Pair{false, producers[0], v};
    }
  }
  return pairs;
}

// Rewrites one DAG. `outputs[v]` are the new ops whose completion stands for old op v's
// output (for a decomposed pair: its last step and/or last chunk).
class Rewriter {
 public:
  Rewriter(const BuildContext& ctx, const LayerDag& old) : ctx_(ctx), old_(old) {}

  LayerDag run() {
    const std::map<int64_t, Pair> pairs = find_pairs(old_);
    std::map<int64_t, bool> second_of_pair;
    for (const auto& [first, pair] : pairs) second_of_pair[pair.second] = true;
    outputs_.assign(static_cast<size_t>(old_.size()), {});
    for (int64_t v = 0; v < old_.size(); ++v) {
      if (const auto it = pairs.find(v); it != pairs.end()) {
        it->second.gather ? add_gather(it->second) : add_scatter(it->second);
      } else if (!second_of_pair.count(v)) {
        outputs_at(v) = {add_after(dag_, old_.op(v), inputs_of(v, -1))};
      }
    }
    return std::move(dag_);
  }

 private:
  std::vector<int64_t>& outputs_at(int64_t v) { return outputs_[static_cast<size_t>(v)]; }

  // New ops standing for the outputs of old v's predecessors, except `skip`. Every
  // predecessor must already be rewritten (old indices are a topological order).
  std::vector<int64_t> inputs_of(int64_t v, int64_t skip) {
    std::vector<int64_t> inputs;
    for (const int64_t p : old_.predecessors(v)) {
      if (p == skip) continue;
      DHELIX_CHECK_MSG(!outputs_at(p).empty(), "op " + old_.op(v).id + " precedes its input");
      inputs.insert(inputs.end(), outputs_at(p).begin(), outputs_at(p).end());
    }
    return inputs;
  }

  Op chunk(const Op& gemm, int64_t c) const {
    DHELIX_CHECK(gemm.shape.m % ctx_.tp == 0);
    return make_gemm(ctx_, gemm.id + ".chunk" + std::to_string(c), gemm.kind, gemm.pass,
                     gemm.gemm_role, gemm.shape.batch, gemm.shape.m / ctx_.tp, gemm.shape.n,
                     gemm.shape.k);
  }

  Op step(const Op& collective, int64_t s) const {
    DHELIX_CHECK(collective.comm_bytes % ctx_.tp == 0);
    return make_comm(ctx_, collective.id + ".step" + std::to_string(s), OpKind::kSendRecv,
                     collective.pass, ParallelDim::kTp, collective.comm_bytes / ctx_.tp,
                     collective.dtype);
  }

  // step1, chunk0, step2, chunk1, ..., step tp-1, chunk tp-2, chunk tp-1: each step is
  // inserted before the chunk it overlaps, so index order issues communication first.
  void add_gather(const Pair& pair) {
    const Op& gather = old_.op(pair.first);
    const Op& gemm = old_.op(pair.second);
    std::vector<int64_t> local = inputs_of(pair.first, -1);
    const std::vector<int64_t> more = inputs_of(pair.second, pair.first);
    local.insert(local.end(), more.begin(), more.end());
    std::vector<int64_t> steps(static_cast<size_t>(ctx_.tp), -1);  // steps[s], s >= 1
    std::vector<int64_t> chunks(static_cast<size_t>(ctx_.tp), -1);
    const auto at = [](std::vector<int64_t>& v, int64_t i) -> int64_t& {
      return v[static_cast<size_t>(i)];
    };
    for (int64_t c = 0; c < ctx_.tp; ++c) {
      if (c + 1 < ctx_.tp) {
        at(steps, c + 1) =
            add_after(dag_, step(gather, c + 1),
                      c == 0 ? inputs_of(pair.first, -1) : std::vector{at(steps, c)});
      }
      at(chunks, c) = add_after(dag_, chunk(gemm, c),
                                c == 0 ? local : std::vector{at(chunks, c - 1), at(steps, c)});
    }
    const int64_t last_step = steps.back();
    const int64_t last_chunk = chunks.back();
    outputs_at(pair.first) = {last_step};
    outputs_at(pair.second) = {last_chunk};
  }

  // chunk0, step1, chunk1, step2, chunk2, ..., step tp-1, chunk tp-1.
  void add_scatter(const Pair& pair) {
    const Op& gemm = old_.op(pair.first);
    const Op& scatter = old_.op(pair.second);
    int64_t last_chunk = add_after(dag_, chunk(gemm, 0), inputs_of(pair.first, -1));
    int64_t last_step = -1;
    for (int64_t s = 1; s < ctx_.tp; ++s) {
      std::vector<int64_t> after = {last_chunk};
      if (last_step >= 0) after.push_back(last_step);
      last_step = add_after(dag_, step(scatter, s), after);
      last_chunk = add_after(dag_, chunk(gemm, s), {last_chunk});
    }
    outputs_at(pair.first) = {last_chunk};
    outputs_at(pair.second) = {last_chunk, last_step};
  }

  const BuildContext& ctx_;
  const LayerDag& old_;
  LayerDag dag_;
  std::vector<std::vector<int64_t>> outputs_;
};

}  // namespace

LayerDags build_intra_batch_layer_dags(const JobSpec& job, int64_t rank) {
  LayerDags normal = build_layer_dags(job, rank);
  const BuildContext ctx = make_context(job, rank);
  if (!ctx.sp) return normal;  // no gathers or scatters to decompose (sp implies tp > 1)
  LayerDags dags;
  dags.forward = Rewriter(ctx, normal.forward).run();
  dags.backward = Rewriter(ctx, normal.backward).run();
  return dags;
}

}  // namespace dhelix
