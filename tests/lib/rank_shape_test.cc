// A rank's shape (lib/rank_shape.h), against hand-computed sizes.

#include "lib/rank_shape.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

// Hidden 64, 4 heads of 16, 2 KV heads, FFN 128, 255 vocabulary entries (not a multiple of
// tp), 3 layers; tp 2 with SP, 2 sequences of 16 tokens.
JobSpec odd_vocabulary_job() {
  JobSpec job;
  job.model.hidden_size = 64;
  job.model.ffn_hidden_size = 128;
  job.model.num_layers = 3;
  job.model.num_attention_heads = 4;
  job.model.num_kv_heads = 2;
  job.model.head_dim = 16;
  job.model.vocab_size = 255;
  job.model.max_seq_length = 64;
  job.parallel.tp = 2;
  job.parallel.sp = true;
  job.parallel.micro_batch_size = 2;
  job.parallel.global_batch_size = 2;
  job.parallel.seq_length = 16;
  return job;
}

TEST(RankShape, SizesOfOneTensorParallelRank) {
  const RankShape s = rank_shape(odd_vocabulary_job(), 1);
  EXPECT_EQ(s.tp, 2);
  EXPECT_EQ(s.tp_rank, 1);
  EXPECT_TRUE(s.sp);
  EXPECT_EQ(s.tokens, 32);  // 2 sequences x 16
  EXPECT_EQ(s.rows, 16);    // T / tp under SP
  EXPECT_EQ(s.heads, 2);
  EXPECT_EQ(s.kv_heads, 1);
  EXPECT_EQ(s.q_width, 32);
  EXPECT_EQ(s.kv_width, 16);
  EXPECT_EQ(s.qkv_width, 64);  // 32 + 2 x 16
  EXPECT_EQ(s.ffn, 64);
  EXPECT_EQ(s.residual_elements(), 16 * 64);
  EXPECT_EQ(s.full_elements(), 32 * 64);
  EXPECT_EQ(s.num_layers, 3);
}

TEST(RankShape, TheLastVocabularyShardHoldsTheRest) {
  const JobSpec job = odd_vocabulary_job();
  const RankShape first = rank_shape(job, 0), last = rank_shape(job, 1);
  EXPECT_EQ(first.vocab_shard, 128);  // ceil(255 / 2)
  EXPECT_EQ(first.vocab_begin, 0);
  EXPECT_EQ(first.vocab_local, 128);
  EXPECT_EQ(last.vocab_begin, 128);
  EXPECT_EQ(last.vocab_local, 127);
}

TEST(RankShape, WithoutSequenceParallelismEveryRankHoldsEveryRow) {
  JobSpec job = odd_vocabulary_job();
  job.parallel.sp = false;
  const RankShape s = rank_shape(job, 0);
  EXPECT_FALSE(s.sp);
  EXPECT_EQ(s.rows, 32);
  job.parallel.tp = 1;
  job.parallel.sp = true;  // asked, but nothing to split over
  EXPECT_FALSE(rank_shape(job, 0).sp);
}

}  // namespace
}  // namespace dhelix
