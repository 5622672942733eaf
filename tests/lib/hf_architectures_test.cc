// The HuggingFace architectures added for models trained today: Qwen2 (biases on Q, K, V
// only), Mistral (sliding-window attention and its cost), Qwen2-MoE (a gated shared expert
// beside the routed ones). Each reads its shipped config (examples/models/hf/), matches the
// published parameter count, and builds layer DAGs whose GEMM and attention FLOPs are the
// closed-form count (lib/model_spec.h).

#include <string>

#include <gtest/gtest.h>

#include "lib/dag_builder.h"
#include "lib/hf_config_reader.h"
#include "profiler/compute_cost.h"
#include "tests/lib/dag_test_jobs.h"

namespace dhelix {
namespace {

using testing::make_job;

std::string hf_example(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/models/hf/" + name + ".config.json";
}

std::vector<std::string> problems_of(const Json& json) {
  ProblemList problems;
  model_from_hf_config(json, "config.json", problems);
  std::vector<std::string> lines;
  for (const Problem& problem : problems.problems()) lines.push_back(problem.to_string());
  return lines;
}

const Op& op_of(const LayerDag& dag, const std::string& id) { return dag.op(dag.find(id).value()); }

// GEMM and attention FLOPs of one layer over the tp·cp ranks sharing it, against the
// closed form's per-layer part (no logits term). `tolerance`: MoE experts compute on
// ceil(N·k·ep/E) tokens each, a little above the formula's share when E does not divide.
void expect_layer_flops_match_formula(JobSpec job, double tolerance = 1e-12) {
  job.parallel.moe_load_imbalance = 1.0;  // balanced routing: the formula's assumption
  const LayerDags dags = build_layer_dags(job, 0);
  double matmul = 0;
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) {
      const Op& op = dag->op(i);
      const bool counted = op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm ||
                           op.kind == OpKind::kAttention;
      if (counted && op.id != "bwd.router_wgrad") matmul += op.flops;
    }
  }
  matmul *= static_cast<double>(job.parallel.tp * job.parallel.cp);
  ModelSpec no_vocab = job.model;
  no_vocab.vocab_size = 0;
  const double formula = training_flops_per_iteration(no_vocab, job.parallel.micro_batch_size,
                                                      job.parallel.seq_length) /
                         static_cast<double>(job.model.num_layers);
  EXPECT_GE(matmul / formula, 1.0 - 1e-12);
  EXPECT_NEAR(matmul / formula, 1.0, tolerance);
}

TEST(HfArchitectures, Qwen2_5_7bHasBiasesOnQkvOnly) {
  const ModelSpec m = read_model_file(hf_example("qwen2.5-7b"));
  EXPECT_EQ(m.name, "qwen2.5-7b");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.linear_bias);
  EXPECT_EQ(m.num_kv_heads, 4);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.sliding_window, 0);  // use_sliding_window is false
  // Published: 7.61B; q, k, v biases 3584 + 2·512 per layer are in it.
  EXPECT_EQ(parameter_count(m), 7615616512);
  ModelSpec no_bias = m;
  no_bias.qkv_bias = false;
  EXPECT_EQ(parameter_count(m) - parameter_count(no_bias), 28 * (3584 + 2 * 512));
  expect_layer_flops_match_formula(make_job(m, {.tp = 4, .sp = true, .seq = 4096}));
}

TEST(HfArchitectures, Qwen2NeedsNoMaxPositionEmbeddings) {
  Json json = read_json_file(hf_example("qwen2.5-7b"));
  json.erase("max_position_embeddings");
  ProblemList problems;
  const ModelSpec m = model_from_hf_config(json, "config.json", problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(m.max_seq_length, 0);  // the job's sequence length is what counts
  EXPECT_EQ(parameter_count(m), 7615616512);
}

TEST(HfArchitectures, Qwen2WindowsOnAllLayersOrNone) {
  Json json = read_json_file(hf_example("qwen2.5-7b"));
  json["use_sliding_window"] = true;
  json["sliding_window"] = 4096;
  json["max_window_layers"] = 0;
  ProblemList problems;
  EXPECT_EQ(model_from_hf_config(json, "config.json", problems).sliding_window, 4096);
  json["max_window_layers"] = 14;
  const std::vector<std::string> lines = problems_of(json);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("/max_window_layers: 14 windows only layers 14 .. 27 of 28"),
            std::string::npos)
      << lines[0];
}

TEST(HfArchitectures, Mistral7bSlidingWindowHalvesAttentionFlopsAt8k) {
  const ModelSpec m = read_model_file(hf_example("mistral-7b-v0.1"));
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(parameter_count(m), 7241732096);  // published
  EXPECT_EQ(attended_keys(m, 8192), 4096);
  EXPECT_EQ(attended_keys(m, 2048), 2048);

  const JobSpec job = make_job(m, {.tp = 8, .sp = true, .seq = 8192});
  const LayerDags dags = build_layer_dags(job, 0);
  const Op& attn = op_of(dags.forward, "fwd.flash_attn");
  EXPECT_EQ(attn.shape.window, 4096);
  EXPECT_NE(attn.signature().find(",causal,w=4096"), std::string::npos) << attn.signature();
  EXPECT_EQ(attn.flops, 4.0 * 4 * 8192 * 4096 * 128);  // 4·heads/tp·q·W·d: half of 8192 keys
  expect_layer_flops_match_formula(job);

  // Time: causal pairs q·W - W²/2 against q²/2 without the window: 0.75 at q = 2W.
  GpuSpec gpu;
  gpu.peak_bf16_tflops = 100;
  gpu.memory_bandwidth_gbps = 1e9;  // keep it compute-bound
  Op full = attn;
  full.shape.window = 0;
  EXPECT_NEAR(compute_kernel_cost(gpu, attn).compute_us / compute_kernel_cost(gpu, full).compute_us,
              0.75, 1e-12);

  // A window no shorter than the sequence changes nothing (and no signature).
  const LayerDags short_seq = build_layer_dags(make_job(m, {.tp = 8, .sp = true, .seq = 4096}), 0);
  EXPECT_EQ(op_of(short_seq.forward, "fwd.flash_attn").shape.window, 0);
}

TEST(HfArchitectures, Qwen15MoeA27bHasASharedExpert) {
  const ModelSpec m = read_model_file(hf_example("qwen1.5-moe-a2.7b"));
  ASSERT_TRUE(m.is_moe());
  EXPECT_EQ(m.moe->num_experts, 60);
  EXPECT_EQ(m.moe->top_k, 4);
  EXPECT_EQ(m.moe->expert_ffn_hidden_size, 1408);
  EXPECT_EQ(m.moe->shared_expert_ffn_hidden_size, 5632);
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_EQ(parameter_count(m), 14315784192);        // published "14.3B"
  EXPECT_EQ(active_parameter_count(m), 2689173504);  // published "2.7B activated"

  const JobSpec job = make_job(m, {.tp = 2, .dp = 8, .ep = 4, .sp = true, .seq = 4096});
  const LayerDags dags = build_layer_dags(job, 0);
  // fc1 of the shared expert: T = 4096 rows after the all-gather, 2·5632/2 columns.
  const Op& fc1 = op_of(dags.forward, "fwd.shared_fc1");
  EXPECT_EQ(fc1.shape.m, 4096);
  EXPECT_EQ(fc1.shape.n, 5632);
  EXPECT_TRUE(dags.forward.find("fwd.reduce_scatter_shared").has_value());
  EXPECT_TRUE(dags.backward.find("bwd.shared_fc1_wgrad").has_value());
  // 60 experts: each expert's tokens are rounded up (about 0.1 % here).
  expect_layer_flops_match_formula(job, 2e-3);
  expect_layer_flops_match_formula(make_job(m, {.dp = 8, .ep = 4, .seq = 2048}), 2e-3);
  // Without the shared expert the forward loses exactly its five ops.
  ModelSpec no_shared = m;
  no_shared.moe->shared_expert_ffn_hidden_size = 0;
  const LayerDags plain = build_layer_dags(
      make_job(no_shared, {.tp = 2, .dp = 8, .ep = 4, .sp = true, .seq = 4096}), 0);
  EXPECT_FALSE(plain.forward.find("fwd.shared_fc1").has_value());
  // all-gather, fc1, activation, fc2, reduce-scatter
  EXPECT_EQ(dags.forward.size() - plain.forward.size(), 5);
}

TEST(HfArchitectures, Qwen2MoeRefusesDenseLayersBetweenSparseOnes) {
  Json json = read_json_file(hf_example("qwen1.5-moe-a2.7b"));
  json["decoder_sparse_step"] = 2;
  json["mlp_only_layers"] = {0, 1};
  const std::vector<std::string> lines = problems_of(json);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("/decoder_sparse_step: 2"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("/mlp_only_layers: [0,1]"), std::string::npos) << lines[1];
}

TEST(HfArchitectures, NewFieldsSurviveTheModelJsonRoundTrip) {
  // Plans carry the model as dhelix model JSON; dhelix-run and --check read it back.
  for (const char* name : {"qwen2.5-7b", "mistral-7b-v0.1", "qwen1.5-moe-a2.7b"}) {
    const ModelSpec m = read_model_file(hf_example(name));
    const Json dumped = Json::parse(model_to_json(m).dump());
    ProblemList problems;
    const ModelSpec back = model_from_json(dumped, "model.json", problems);
    EXPECT_TRUE(problems.empty()) << name;
    EXPECT_EQ(back.qkv_bias, m.qkv_bias) << name;
    EXPECT_EQ(back.sliding_window, m.sliding_window) << name;
    EXPECT_EQ(back.max_seq_length, m.max_seq_length) << name;
    EXPECT_EQ(parameter_count(back), parameter_count(m)) << name;
  }
}

}  // namespace
}  // namespace dhelix
