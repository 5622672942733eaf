#pragma once
// Jobs built in code for the DAG tests: Llama-3-70B and Phi-3.5-MoE shapes (from their
// published HuggingFace configs), a GPT-style model, on 8-GPU nodes.

#include <cstdint>

#include "lib/job_spec.h"

namespace dhelix::testing {

inline ModelSpec llama3_70b() {
  ModelSpec m;
  m.name = "llama3-70b";
  m.hidden_size = 8192;
  m.ffn_hidden_size = 28672;
  m.num_layers = 80;
  m.num_attention_heads = 64;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 128256;
  m.max_seq_length = 8192;
  return m;
}

inline ModelSpec phi35_moe() {
  ModelSpec m;
  m.name = "phi-3.5-moe";
  m.norm = NormKind::kLayerNorm;
  m.hidden_size = 4096;
  m.ffn_hidden_size = 6400;
  m.num_layers = 32;
  m.num_attention_heads = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 32064;
  m.max_seq_length = 4096;
  m.moe = MoeSpec{16, 2, 0.0, 6400};
  return m;
}

inline ModelSpec gpt_style() {
  ModelSpec m;
  m.name = "gpt-18b";
  m.norm = NormKind::kLayerNorm;
  m.activation = ActivationKind::kGelu;
  m.position = PositionKind::kLearned;
  m.linear_bias = true;
  m.hidden_size = 6144;
  m.ffn_hidden_size = 24576;
  m.num_layers = 40;
  m.num_attention_heads = 48;
  m.num_kv_heads = 48;
  m.head_dim = 128;
  m.vocab_size = 51200;
  m.max_seq_length = 4096;
  return m;
}

struct Shape {
  int64_t tp = 1, cp = 1, dp = 1, pp = 1, ep = 1;
  bool sp = false;
  int64_t seq = 4096;
  int64_t micro_batch = 1;
};

inline JobSpec make_job(const ModelSpec& model, const Shape& s) {
  JobSpec job;
  job.name = "test";
  job.source_file = "job.json";
  job.model = model;
  job.cluster.name = "test-cluster";
  job.cluster.gpus_per_node = 8;
  ParallelSpec& p = job.parallel;
  p.tp = s.tp;
  p.cp = s.cp;
  p.dp = s.dp;
  p.pp = s.pp;
  p.ep = s.ep;
  p.sp = s.sp;
  p.seq_length = s.seq;
  p.micro_batch_size = s.micro_batch;
  p.global_batch_size = s.micro_batch * s.dp * 8;
  return job;
}

}  // namespace dhelix::testing
