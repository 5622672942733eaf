#include "planner/memory_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "planner/iteration_metrics.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// h 64, SwiGLU FFN 256, 4 heads of 16, 4 layers, vocab 100, untied, RMSNorm, bf16.
// One layer: attention 4·64·64 = 16384, MLP 3·64·256 = 49152, norms 2·64 = 128: 65664.
ModelSpec small_model() {
  ModelSpec m;
  m.name = "small";
  m.hidden_size = 64;
  m.ffn_hidden_size = 256;
  m.num_layers = 4;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.head_dim = 16;
  m.vocab_size = 100;
  m.max_seq_length = 128;
  return m;
}

ParallelSpec small_parallel() {
  ParallelSpec p;
  p.dp = 4;
  p.tp = 2;
  p.sp = true;
  p.pp = 2;
  p.micro_batch_size = 1;
  p.seq_length = 32;
  p.global_batch_size = 32;
  return p;
}

// Per GPU and layer: (65664 - 128) / 2 + 128 = 32896; two layers per stage: 65792.
// Embedding and head: 100·64 / 2 = 3200 each; final norm 64.
TEST(MemoryModel, HandComputedModelStates) {
  const ModelSpec model = small_model();
  const ParallelSpec parallel = small_parallel();
  EXPECT_EQ(layer_parameter_count(model), 65664);
  EXPECT_EQ(stage_parameters(model, parallel, PipelineShape::kOneFOneB, 0).total(), 68992);
  EXPECT_EQ(stage_parameters(model, parallel, PipelineShape::kOneFOneB, 1).total(), 69056);
  EXPECT_EQ(stage_parameters(model, parallel, PipelineShape::kW, 0).total(), 72256);
  EXPECT_EQ(stage_parameters(model, parallel, PipelineShape::kW, 1).total(), 65792);

  const std::vector<StageMemory> w =
      stage_memory(model, parallel, PipelineShape::kW, MemoryOptions{}, {1000, 2000});
  EXPECT_EQ(w[0].weight_bytes, 2 * 72256);
  EXPECT_EQ(w[0].gradient_bytes, 4 * 72256);
  EXPECT_EQ(w[0].optimizer_bytes, 12 * 72256);
  EXPECT_EQ(w[1].activation_bytes, 2000);
  EXPECT_EQ(w[0].total_bytes(), 18 * 72256 + 1000);
  MemoryOptions distributed;
  distributed.distributed_optimizer = true;
  const std::vector<StageMemory> wd =
      stage_memory(model, parallel, PipelineShape::kW, distributed, {0, 0});
  EXPECT_EQ(wd[0].optimizer_bytes, 12 * 72256 / 4);  // over dp = 4

  // Tied embeddings: the W keeps one copy on stage 0; 1F1B keeps a copy on the last stage.
  ModelSpec tied = model;
  tied.tied_embeddings = true;
  EXPECT_EQ(stage_parameters(tied, parallel, PipelineShape::kW, 0).total(), 72256 - 3200);
  EXPECT_EQ(stage_parameters(tied, parallel, PipelineShape::kOneFOneB, 1).total(), 69056);
}

// MoE: 8 experts of FFN 128, top-2, ep 4. Per GPU and layer: attention 16384 / 2 = 8192,
// norms 128 and router 64·8 = 512 replicated, experts 8·3·64·128 / 4 = 49152.
TEST(MemoryModel, ExpertsShardOverEp) {
  ModelSpec model = small_model();
  model.moe = MoeSpec{8, 2, 0.0, 128};
  ParallelSpec parallel = small_parallel();
  parallel.ep = 4;
  parallel.pp = 1;
  parallel.expert_tp = 1;  // whole experts on each TP rank
  model.num_layers = 2;
  const StageParameters params = stage_parameters(model, parallel, PipelineShape::kW, 0);
  EXPECT_EQ(params.expert, 2 * 49152);
  EXPECT_EQ(params.dense, 2 * (8192 + 128 + 512) + 3200 + 64 + 3200);
  MemoryOptions distributed;
  distributed.distributed_optimizer = true;
  const StageMemory m = stage_memory(model, parallel, PipelineShape::kW, distributed, {0})[0];
  // Dense states over dp·cp = 4, experts over dp·cp·tp / ep = 2.
  EXPECT_EQ(m.optimizer_bytes, 12 * params.dense / 4 + 12 * params.expert / 2);

  // Activations, 32 tokens, tp 2 with SP: norm/GEMM inputs 2·4·64 = 512 per token;
  // attention 2·(2·64 + 2·64) = 512; two expert copies of 2·(2·64 + 3·128) = 1024 each;
  // fp32 router probabilities 4·8 = 32. 32·512/2 + 32·(512 + 2048 + 32)/2 = 49664.
  EXPECT_EQ(layer_activation_bytes(model, parallel), 49664);
}

// Expert tensor parallelism splits each expert over the TP group: with expert_tp = tp = 2 the
// experts of the test above keep 49152 / 2 = 24576 parameters a layer, and their optimizer
// shards over dp·cp·tp / (ep·etp) = 4·1·2 / (4·2) = 1 rank.
TEST(MemoryModel, ExpertTensorParallelismSplitsExperts) {
  ModelSpec model = small_model();
  model.moe = MoeSpec{8, 2, 0.0, 128};
  ParallelSpec parallel = small_parallel();
  parallel.ep = 4;
  parallel.pp = 1;
  model.num_layers = 2;
  ASSERT_EQ(parallel.expert_tp_size(), parallel.tp);  // Megatron-Core's default
  const StageParameters params = stage_parameters(model, parallel, PipelineShape::kW, 0);
  EXPECT_EQ(params.expert, 2 * 24576);
  MemoryOptions distributed;
  distributed.distributed_optimizer = true;
  const StageMemory m = stage_memory(model, parallel, PipelineShape::kW, distributed, {0})[0];
  EXPECT_EQ(m.optimizer_bytes, 12 * params.dense / 4 + 12 * params.expert / 1);
}

// GPT-3 style layer (MHA, GELU with f = 4h, dropout) under SP and flash attention:
// Korthikanti et al.'s 34·s·b·h/t; without SP their s·b·h·(10 + 24/t).
TEST(MemoryModel, ReproducesKorthikanti) {
  ModelSpec gpt;
  gpt.norm = NormKind::kLayerNorm;
  gpt.activation = ActivationKind::kGelu;
  gpt.hidden_size = 1024;
  gpt.ffn_hidden_size = 4096;
  gpt.num_layers = 24;
  gpt.num_attention_heads = 16;
  gpt.num_kv_heads = 16;
  gpt.head_dim = 64;
  gpt.vocab_size = 50257;
  ParallelSpec p;
  p.tp = 4;
  p.sp = true;
  p.seq_length = 2048;
  p.micro_batch_size = 1;
  MemoryOptions dropout;
  dropout.dropout = true;
  EXPECT_EQ(layer_activation_bytes(gpt, p, dropout), 34 * 2048 * 1024 / 4);
  p.sp = false;
  EXPECT_EQ(layer_activation_bytes(gpt, p, dropout), 2048 * 1024 * (10 + 24 / 4));
}

// Llama-3-8B's layer (GQA 32/8, SwiGLU 14336, no dropout) also comes to 34·s·b·h/t:
// 8h (norm and GEMM inputs) + 2·(2h + 2h/4) (Q, K, V, O) + 2·3·3.5h (SwiGLU) = 34h.
TEST(MemoryModel, LlamaLayerActivations) {
  ModelSpec llama;
  llama.hidden_size = 4096;
  llama.ffn_hidden_size = 14336;
  llama.num_layers = 32;
  llama.num_attention_heads = 32;
  llama.num_kv_heads = 8;
  llama.head_dim = 128;
  llama.vocab_size = 128256;
  ParallelSpec p;
  p.tp = 8;
  p.sp = true;
  p.seq_length = 4096;
  p.micro_batch_size = 1;
  EXPECT_EQ(layer_activation_bytes(llama, p), int64_t{34} * 4096 * 4096 / 8);
  p.cp = 2;
  EXPECT_EQ(layer_activation_bytes(llama, p), int64_t{34} * 4096 * 4096 / 16);
  // Logits of 4096/2 tokens over 128256/8 = 16032 words, bf16 and fp32.
  EXPECT_EQ(head_loss_transient_bytes(llama, p), int64_t{2048} * 16032 * 6);
}

TEST(MemoryModel, CheckFitsListsEveryTerm) {
  GpuSpec gpu;
  gpu.name = "H100-SXM";
  gpu.memory_bytes = 80 * kGiB;
  const MemoryBudget budget = memory_budget(gpu);
  EXPECT_EQ(budget.reserve_bytes, 4 * kGiB + 2 * kGiB);  // 5% + 2 GiB
  StageMemory big;
  big.stage = 0;
  big.weight_bytes = 10 * kGiB;
  big.gradient_bytes = 20 * kGiB;
  big.optimizer_bytes = 30 * kGiB;
  big.activation_bytes = 21 * kGiB + kGiB / 4;
  StageMemory small = big;
  small.stage = 1;
  small.activation_bytes = 0;
  check_fits({small}, budget, PipelineScheme::kDHelix);  // 60 GiB fits in 74
  try {
    check_fits({big, small}, budget, PipelineScheme::kDHelix);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInfeasible);
    EXPECT_EQ(std::string(e.what()),
              "dhelix: stage 0 needs 81.25 GiB but 74.00 GiB are usable on H100-SXM (80.00 GiB "
              "minus 6.00 GiB reserve): weights 10.00 + gradients 20.00 + optimizer states "
              "30.00 + activations 21.25 GiB");
  }
}

// Peak live activations (in layer·micro-batch units) of the W with both strands against
// 1F1B, 16 layers on pp 4, 8 micro-batches, unit costs. 1F1B's stage 0 keeps pp = 4
// micro-batches of its 4 layers: 16, its last stage 1 micro-batch: 4. In the W's steady
// state stage p keeps micro-batch j's down chunk from slot p + 2j to slot 4·pp-1-p + 2j
// and its up chunk from slot 2·pp-1-p + 2j to 2·pp+p + 2j (pipeline_schedule.h): at one
// new micro-batch every two slots that is (4·pp-1-2p)/2 + (2p+1)/2 = 2·pp = 8 chunks of 2
// layers, 16 layers, on every stage; the SI block's worst layer pair adds one layer: 17.
// The W's peak is 17/16 = 1.06 times 1F1B's (the paper, section 6.5: 39B against 40B
// trainable, close), and it is the same on every stage instead of falling to 4 on the last.
TEST(MemoryModel, PeakActivationsWAgainstOneFOneB) {
  auto costs = [](int64_t layers_per_chunk, double f, double b, double si) {
    StageCosts c;
    c.forward_chunk_us = f;
    c.backward_chunk_us = b;
    c.si_block_us = si;
    c.layers_per_chunk = layers_per_chunk;
    c.activation_bytes_per_layer = 1;
    return std::vector<StageCosts>(4, c);
  };
  const PipelineSimulation one =
      simulate_pipeline(make_one_f_one_b_schedule(4, 8), costs(4, 2, 4, 0));
  const PipelineSimulation w = simulate_pipeline(make_w_schedule(4, 8), costs(2, 1, 2, 2.4));
  EXPECT_EQ(one.stages[0].peak_activation_bytes, 16);
  EXPECT_EQ(one.stages[3].peak_activation_bytes, 4);
  EXPECT_EQ(one.peak_activation_bytes(), 16);
  std::vector<int64_t> w_peaks;
  for (const StageSimulation& s : w.stages) w_peaks.push_back(s.peak_activation_bytes);
  EXPECT_EQ(w_peaks, (std::vector<int64_t>{17, 17, 17, 17}));
  EXPECT_EQ(w.peak_activation_bytes(), 17);
}

TEST(IterationMetrics, HandComputed) {
  const ModelSpec model = small_model();
  ParallelSpec parallel = small_parallel();  // world 4·2·2 = 16, 32 sequences of 32 tokens
  const IterationMetrics m = iteration_metrics(model, parallel, 100.0, 2e6);
  EXPECT_EQ(m.tokens, 1024);
  EXPECT_DOUBLE_EQ(m.tokens_per_second, 512.0);
  const double flops = training_flops_per_iteration(model, 32, 32);
  EXPECT_DOUBLE_EQ(m.model_flops, flops);
  EXPECT_DOUBLE_EQ(m.tflops_per_gpu, flops / 2.0 / 16.0 / 1e12);
  EXPECT_DOUBLE_EQ(m.mfu, m.tflops_per_gpu / 100.0);
  EXPECT_THROW(iteration_metrics(model, parallel, 100.0, 0.0), Error);
}

// A GPU whose memory the reserve takes whole: the field that sets it is named, with its
// value and the reserve (it once read "-2.00 GiB are usable").
TEST(MemoryModel, GpuBelowTheReserveIsRefused) {
  JobSpec job;
  job.source_file = "job.json";
  job.cluster.name = "small";
  job.cluster.source_file = "small.json";
  job.cluster.gpu.name = "Tiny";
  job.cluster.gpu.memory_bytes = int64_t{4} << 20;
  try {
    memory_budget(job);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInfeasible);
    EXPECT_EQ(std::string(error.what()),
              "small.json: /gpu/memory_bytes: 4194304 bytes (4.00 MiB) is no more than the "
              "memory every plan keeps free on a GPU, 2147693363 bytes (2.00 GiB: 5 % of the "
              "memory for allocator fragmentation + 2.00 GiB for the CUDA context, library "
              "workspaces and NCCL buffers): no plan fits on Tiny; give the GPU's real memory");
  }
  job.cluster.source_file = "job.json";  // an inline cluster
  EXPECT_THROW(
      {
        try {
          memory_budget(job);
        } catch (const Error& error) {
          EXPECT_EQ(std::string(error.what()).rfind("job.json: /cluster/gpu/memory_bytes: ", 0),
                    0u);
          throw;
        }
      },
      Error);
  job.cluster.gpu.memory_bytes = int64_t{80} << 30;
  EXPECT_EQ(memory_budget(job).usable_bytes(), memory_budget(job.cluster.gpu).usable_bytes());
}

// An iteration faster than the GPUs' peak allows for the model's FLOPs is refused (it once
// printed 555 % MFU); exactly at the peak is 100 %.
TEST(IterationMetrics, AboveThePeakIsRefused) {
  const ModelSpec model = small_model();
  const ParallelSpec parallel = small_parallel();
  const double flops = training_flops_per_iteration(model, 32, 32);
  const double at_peak_us = flops / 16.0 / 100e12 * 1e6;  // 16 GPUs of 100 TFLOP/s
  EXPECT_NEAR(iteration_metrics(model, parallel, 100.0, at_peak_us * (1 + 1e-12)).mfu, 1.0, 1e-9);
  try {
    iteration_metrics(model, parallel, 100.0, at_peak_us / 5.55, "p.json");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    const std::string message = error.what();
    EXPECT_EQ(message.find("p.json: its times give an iteration of "), 0u) << message;
    EXPECT_NE(message.find("at 555.0 % of the peak of its 16 GPUs (100 TFLOP/s each)"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace dhelix
