#include "lib/rank_shape.h"

#include <algorithm>

#include "lib/error.h"
#include "lib/placement.h"

namespace dhelix {

RankShape rank_shape(const JobSpec& job, int64_t rank) {
  const ModelSpec& m = job.model;
  const ParallelSpec& p = job.parallel;
  DHELIX_CHECK(p.tp >= 1 && p.cp >= 1 && p.ep >= 1 && p.micro_batch_size >= 1);
  DHELIX_CHECK(m.num_attention_heads % p.tp == 0 && m.num_kv_heads % p.tp == 0 &&
               p.seq_length % p.cp == 0);
  RankShape s;
  s.tp = p.tp;
  s.cp = p.cp;
  s.ep = m.is_moe() ? p.ep : 1;
  s.tp_rank = Placement(p, job.cluster.gpus_per_node).coordinates(rank).tp;
  s.sp = p.sp && p.tp > 1;
  s.micro_batch = p.micro_batch_size;
  s.seq_shard = p.seq_length / p.cp;
  s.tokens = p.tokens_per_rank();
  DHELIX_CHECK(!s.sp || s.tokens % p.tp == 0);
  s.rows = s.sp ? s.tokens / p.tp : s.tokens;
  s.hidden = m.hidden_size;
  s.head_dim = m.head_dim;
  s.heads = m.num_attention_heads / p.tp;
  // validate_job requires tp to divide num_kv_heads (no KV-head replication), so every rank
  // holds an equal, non-empty share.
  s.kv_heads = m.num_kv_heads / p.tp;
  s.q_width = s.heads * s.head_dim;
  s.kv_width = s.kv_heads * s.head_dim;
  s.qkv_width = s.q_width + 2 * s.kv_width;
  s.ffn = m.ffn_hidden_size / p.tp;
  s.vocab = m.vocab_size;
  s.vocab_shard = (s.vocab + s.tp - 1) / s.tp;
  s.vocab_begin = std::min(s.vocab, s.tp_rank * s.vocab_shard);
  s.vocab_local = std::min(s.vocab_shard, s.vocab - s.vocab_begin);
  s.num_layers = m.num_layers;
  return s;
}

}  // namespace dhelix
