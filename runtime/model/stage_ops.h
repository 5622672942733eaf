#pragma once
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

#include "lib/error.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

template <class B>
std::optional<BasicBoundOp<B>> bind_embedding_op(const std::string& op, const ExtrasContext<B>& c) {
  const Dims d = c.dims;
  EmbeddingState<B>& s = *c.embedding_state;
  Parameter<B>& table = *c.embedding;
  const TokenBuffers<B>* t = c.tokens;
  if (op == "fwd.embedding") {
    return computation<B>([d, &s, t, w = table.compute](const typename B::Exec& e) {
      B::embedding_forward(e, d.tokens, d.hidden, t->tokens, w, d.vocab_begin, d.vocab_local,
                           s.partial);
    });
  }
  if (op == "fwd.reduce_scatter_embedding") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(scatter_rows(d, s.partial, s.out));
  }
  if (op == "fwd.allreduce_embedding") {
    if (d.sp || d.tp == 1) throw_wrong_mode(op, d);
    return communication<B>(reduce_in_place(d, s.out));
  }
  if (op == "bwd.allgather_embedding") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.dout, s.dout_full));
  }
  if (op == "bwd.embedding") {
    return computation<B>([d, &s, t, dw = table.gradient](const typename B::Exec& e) {
      B::embedding_backward(e, d.tokens, d.hidden, t->tokens, s.dout_full, d.vocab_begin,
                            d.vocab_local, dw);
    });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_head_forward(const std::string& op, const ExtrasContext<B>& c) {
  const Dims d = c.dims;
  HeadState<B>& s = *c.head_state;
  const TokenBuffers<B>* t = c.tokens;
  if (op == "fwd.final_norm") {
    return computation<B>([d, &s, gain = c.final_norm->values](const typename B::Exec& e) {
      B::rmsnorm_forward(e, d.rows, d.hidden, s.x, gain, d.norm_eps, s.norm_out, s.norm_rstd);
    });
  }
  if (op == "fwd.allgather_head") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.norm_out, s.head_in));
  }
  if (op == "fwd.head") {
    return computation<B>([d, &s, t, w = c.head->compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.hidden, d.vocab_local, s.head_in, w, s.logits);
      B::vocab_parallel_stats(e, d.tokens, d.vocab_local, d.vocab_begin, s.logits, t->targets,
                              s.stats_local);
    });
  }
  if (op == "fwd.allreduce_loss") {
    if (d.tp == 1) throw_wrong_mode(op, d);
    return communication<B>(collective(CollectiveKind::kAllGather, s.stats_local, s.stats_all,
                                       d.tokens * cpu::kVocabStatsPerRow));
  }
  if (op == "fwd.loss") {
    // The mean over valid tokens is taken on the host once the iteration has finished
    // (BasicStageModel::micro_batch_losses): here only the per-token losses are computed.
    return computation<B>(
        [d, &s, t, ran = c.loss_ran, mb = c.micro_batch](const typename B::Exec& e) {
          B::vocab_parallel_combine(e, d.tokens, d.tp, d.vocab_shard, s.stats_all, t->targets,
                                    s.lse, s.token_loss);
          DHELIX_CHECK(mb < static_cast<int64_t>(ran->size()));
          (*ran)[static_cast<size_t>(mb)] = 1;
        });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_head_backward(const std::string& op,
                                                  const ExtrasContext<B>& c) {
  const Dims d = c.dims;
  HeadState<B>& s = *c.head_state;
  const TokenBuffers<B>* t = c.tokens;
  if (op == "bwd.loss") {
    return computation<B>([d, &s, t, scale = c.loss_scale](const typename B::Exec& e) {
      B::vocab_parallel_backward(e, d.tokens, d.vocab_local, d.vocab_begin, s.logits, t->targets,
                                 s.lse, *scale, s.dlogits);
    });
  }
  if (op == "bwd.head_dgrad") {
    return computation<B>([d, &s, w = c.head->compute](const typename B::Exec& e) {
      B::linear_dgrad(e, d.tokens, d.hidden, d.vocab_local, s.dlogits, w, s.d_head_in);
    });
  }
  if (op == "bwd.head_wgrad") {
    return computation<B>([d, &s, dw = c.head->gradient](const typename B::Exec& e) {
      B::linear_wgrad_accumulate(e, d.tokens, d.hidden, d.vocab_local, s.dlogits, s.head_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_head") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(scatter_rows(d, s.d_head_in, s.d_norm_out));
  }
  if (op == "bwd.allreduce_head") {
    if (d.sp || d.tp == 1) throw_wrong_mode(op, d);
    return communication<B>(reduce_in_place(d, s.d_head_in));
  }
  if (op == "bwd.final_norm") {
    return computation<B>([d, &s, gain = c.final_norm->values,
                           dgain = c.final_norm->gradient](const typename B::Exec& e) {
      B::rmsnorm_backward(e, d.rows, d.hidden, s.x, gain, s.norm_rstd, s.d_norm_out, s.dx, dgain);
    });
  }
  return std::nullopt;
}

/// Binds one stage-extra op (embedding, head, loss); nullopt when unknown.
template <class B>
std::optional<BasicBoundOp<B>> bind_extra(const std::string& op, const ExtrasContext<B>& context) {
  if (is_embedding_op(op)) return bind_embedding_op(op, context);
  if (std::optional<BasicBoundOp<B>> bound = bind_head_forward(op, context)) return bound;
  return bind_head_backward(op, context);
}

}  // namespace dhelix::rt::model_detail
