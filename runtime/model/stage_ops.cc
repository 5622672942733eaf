// The stage extras' ops (ids and order: lib/dag_builder_stage.cc).
//
// Embedding (vocab-parallel): each rank looks up the tokens of its table rows (zeros for
// the rest) and the partial outputs are summed over TP: reduce_scatter to this rank's rows
// with SP, all_reduce without. Backward gathers the residual gradient (SP) and scatter-adds
// it into the table shard's gradient.
//
// Head and loss (vocab-parallel cross-entropy): fwd.head computes this rank's logit columns
// and, per token, its shard's (max, sum of exp(z - max), target logit or 0). The DAG models
// the exchange as one all-reduce of 3T fp32 values; it is run as an all_gather of those
// triples instead, so that fwd.loss can fold them in rank order 0, 1, ... on every rank:
// the same bits everywhere, whatever the message arrival order. With tp = 1 there is no
// comm op and fwd.loss reads the one triple per token directly.

#include <cmath>

#include "lib/error.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {
namespace {

std::optional<BoundOp> bind_embedding_op(const std::string& op, const ExtrasContext& c) {
  const Dims d = c.dims;
  EmbeddingState& s = *c.embedding_state;
  Parameter& table = *c.embedding;
  const TokenBuffers* t = c.tokens;
  if (op == "fwd.embedding") {
    return computation([d, &s, t, w = table.values.data()] {
      cpu::embedding_forward(d.tokens, d.hidden, t->tokens.data(), w, d.vocab_begin, d.vocab_local,
                             s.partial);
    });
  }
  if (op == "fwd.reduce_scatter_embedding") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(scatter_rows(d, s.partial, s.out));
  }
  if (op == "fwd.allreduce_embedding") {
    if (d.sp || d.tp == 1) throw_wrong_mode(op, d);
    return communication(reduce_in_place(d, s.out));
  }
  if (op == "bwd.allgather_embedding") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(gather_rows(d, s.dout, s.dout_full));
  }
  if (op == "bwd.embedding") {
    return computation([d, &s, t, dw = table.gradient.data()] {
      cpu::embedding_backward(d.tokens, d.hidden, t->tokens.data(), s.dout_full, d.vocab_begin,
                              d.vocab_local, dw);
    });
  }
  return std::nullopt;
}

std::optional<BoundOp> bind_head_forward(const std::string& op, const ExtrasContext& c) {
  const Dims d = c.dims;
  HeadState& s = *c.head_state;
  const TokenBuffers* t = c.tokens;
  if (op == "fwd.final_norm") {
    return computation([d, &s, gain = c.final_norm->values.data()] {
      cpu::rmsnorm_forward(d.rows, d.hidden, s.x, gain, kRmsNormEps, s.norm_out, s.norm_rstd);
    });
  }
  if (op == "fwd.allgather_head") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(gather_rows(d, s.norm_out, s.head_in));
  }
  if (op == "fwd.head") {
    return computation([d, &s, t, w = c.head->values.data()] {
      cpu::linear_forward(d.tokens, d.hidden, d.vocab_local, s.head_in, w, s.logits);
      cpu::vocab_parallel_stats(d.tokens, d.vocab_local, d.vocab_begin, s.logits, t->targets.data(),
                                s.stats_local);
    });
  }
  if (op == "fwd.allreduce_loss") {
    if (d.tp == 1) throw_wrong_mode(op, d);
    return communication(CollectiveRequest{CollectiveKind::kAllGather, s.stats_local, s.stats_all,
                                           d.tokens * cpu::kVocabStatsPerRow});
  }
  if (op == "fwd.loss") {
    return computation([d, &s, t, losses = c.losses, mb = c.micro_batch] {
      cpu::vocab_parallel_combine(d.tokens, d.tp, d.vocab_shard, s.stats_all, t->targets.data(),
                                  s.lse, s.token_loss);
      double sum = 0.0;
      int64_t valid = 0;
      for (int64_t i = 0; i < d.tokens; ++i) {
        if (t->targets[static_cast<size_t>(i)] < 0) continue;
        sum += s.token_loss[i];
        ++valid;
      }
      DHELIX_CHECK(mb < static_cast<int64_t>(losses->size()));
      (*losses)[static_cast<size_t>(mb)] =
          valid == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(valid));
    });
  }
  return std::nullopt;
}

std::optional<BoundOp> bind_head_backward(const std::string& op, const ExtrasContext& c) {
  const Dims d = c.dims;
  HeadState& s = *c.head_state;
  const TokenBuffers* t = c.tokens;
  if (op == "bwd.loss") {
    return computation([d, &s, t, scale = c.loss_scale] {
      cpu::vocab_parallel_backward(d.tokens, d.vocab_local, d.vocab_begin, s.logits,
                                   t->targets.data(), s.lse, *scale, s.dlogits);
    });
  }
  if (op == "bwd.head_dgrad") {
    return computation([d, &s, w = c.head->values.data()] {
      cpu::linear_dgrad(d.tokens, d.hidden, d.vocab_local, s.dlogits, w, s.d_head_in);
    });
  }
  if (op == "bwd.head_wgrad") {
    return computation([d, &s, dw = c.head->gradient.data()] {
      cpu::linear_wgrad_accumulate(d.tokens, d.hidden, d.vocab_local, s.dlogits, s.head_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_head") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(scatter_rows(d, s.d_head_in, s.d_norm_out));
  }
  if (op == "bwd.allreduce_head") {
    if (d.sp || d.tp == 1) throw_wrong_mode(op, d);
    return communication(reduce_in_place(d, s.d_head_in));
  }
  if (op == "bwd.final_norm") {
    return computation([d, &s, gain = c.final_norm->values.data(),
                        dgain = c.final_norm->gradient.data()] {
      cpu::rmsnorm_backward(d.rows, d.hidden, s.x, gain, s.norm_rstd, s.d_norm_out, s.dx, dgain);
    });
  }
  return std::nullopt;
}

}  // namespace

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

std::optional<BoundOp> bind_extra(const std::string& op, const ExtrasContext& context) {
  if (is_embedding_op(op)) return bind_embedding_op(op, context);
  if (std::optional<BoundOp> bound = bind_head_forward(op, context)) return bound;
  return bind_head_backward(op, context);
}

}  // namespace dhelix::rt::model_detail
