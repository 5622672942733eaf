#include "lib/job_validation.h"

#include <gtest/gtest.h>

#include "lib/job_reader.h"

namespace dhelix {
namespace {

// A Llama-3-8B-shaped model on an 8-node A40-like cluster, dp16 tp4: valid as it stands.
JobSpec valid_job() {
  JobSpec job;
  job.name = "test";
  job.source_file = "job.json";
  job.model.name = "llama-8b";
  job.model.hidden_size = 4096;
  job.model.num_layers = 32;
  job.model.num_attention_heads = 32;
  job.model.num_kv_heads = 8;
  job.model.max_seq_length = 8192;
  job.cluster.name = "a40";
  job.cluster.gpus_per_node = 8;
  job.cluster.num_nodes = 8;
  job.parallel.dp = 16;
  job.parallel.tp = 4;
  job.parallel.sp = true;
  job.parallel.global_batch_size = 1024;
  job.parallel.seq_length = 8192;
  return job;
}

JobSpec moe_job() {
  JobSpec job = valid_job();
  job.model.name = "phi-31b";
  job.model.num_layers = 24;
  job.model.moe = MoeSpec{
      .num_experts = 16, .top_k = 2, .capacity_factor = 6.0, .expert_ffn_hidden_size = 6400};
  job.parallel.tp = 1;
  job.parallel.sp = false;
  job.parallel.pp = 4;
  job.parallel.ep = 8;
  return job;
}

std::vector<std::string> messages(const JobSpec& job) {
  std::vector<std::string> out;
  const ProblemList problems = validate_job(job);
  for (const Problem& problem : problems.problems()) out.push_back(problem.to_string());
  return out;
}

using Messages = std::vector<std::string>;

TEST(JobValidation, ValidJobsHaveNoProblems) {
  EXPECT_EQ(messages(valid_job()), Messages{});
  EXPECT_EQ(messages(moe_job()), Messages{});
}

TEST(JobValidation, WorldSizeMustFitAFixedCluster) {
  JobSpec job = valid_job();
  job.parallel.tp = 8;
  job.parallel.global_batch_size = 1024;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel: world size dp·tp·cp·pp = 16·8·1·1 = 128 "
                                    "is more than cluster a40 has (8 nodes × 8 GPUs = 64)"});
  job.cluster.num_nodes = 0;  // as many nodes as the job needs
  EXPECT_EQ(messages(job), Messages{});
}

TEST(JobValidation, TensorParallelMustDivideHeads) {
  JobSpec job = valid_job();
  job.parallel.dp = 1;
  job.parallel.tp = 3;
  job.parallel.sp = false;
  EXPECT_EQ(messages(job),
            (Messages{"job.json: /parallel/tp: 3 does not divide num_attention_heads = 32",
                      "job.json: /parallel/tp: 3 does not divide num_kv_heads = 8"}));
  job.parallel.tp = 16;  // divides 32 query heads but not 8 KV heads
  job.parallel.dp = 4;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/tp: 16 does not divide num_kv_heads = 8"});
}

TEST(JobValidation, SequenceParallelNeedsTensorParallel) {
  JobSpec job = valid_job();
  job.parallel.tp = 1;
  job.parallel.dp = 64;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/sp: true requires tp > 1 (sequence "
                                    "parallelism splits activations over the TP group; tp = 1)"});
}

TEST(JobValidation, ExpertParallelNeedsAnMoeModel) {
  JobSpec job = valid_job();
  job.parallel.ep = 2;
  EXPECT_EQ(
      messages(job),
      Messages{
          "job.json: /parallel/ep: 2 requires a mixture-of-experts model (llama-8b is dense)"});
}

TEST(JobValidation, ExpertParallelMustDivideExperts) {
  JobSpec job = moe_job();
  job.parallel.ep = 3;
  job.parallel.dp = 12;
  job.parallel.global_batch_size = 1200;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/ep: 3 does not divide num_experts = 16"});
}

TEST(JobValidation, ExpertParallelMustDivideDataTimesContextParallel) {
  JobSpec job = moe_job();
  job.parallel.dp = 4;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/ep: 8 does not divide dp·cp = 4·1 = 4 (EP groups are "
                     "carved out of the data- and context-parallel ranks)"});
  job.parallel.cp = 2;  // dp·cp = 8 now holds one EP group
  job.parallel.seq_length = 8192;
  job.parallel.dp = 4;
  EXPECT_EQ(messages(job), Messages{});
}

TEST(JobValidation, SequenceMustSplitOverContextAndSequenceParallel) {
  JobSpec job = valid_job();
  job.parallel.dp = 2;
  job.parallel.tp = 8;
  job.parallel.cp = 2;
  job.parallel.pp = 2;
  job.parallel.global_batch_size = 512;
  job.parallel.seq_length = 8200;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/seq_length: 8200 is not divisible by "
                                    "2·cp·tp = 2·2·8 = 32 (nearest valid: 8192 or 8224)"});
  job.parallel.sp = false;
  job.parallel.seq_length = 8190;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/seq_length: 8190 is not divisible by "
                                    "2·cp = 2·2 = 4 (nearest valid: 8188 or 8192)"});
  job.parallel.cp = 1;
  job.parallel.dp = 4;
  EXPECT_EQ(messages(job), Messages{});  // neither CP nor SP splits the sequence
  job.parallel.sp = true;
  job.parallel.seq_length = 8191;
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/seq_length: 8191 is not divisible by "
                                    "tp (sequence parallel) = 8 (nearest valid: 8184 or 8192)"});
}

TEST(JobValidation, GlobalBatchMustDivideIntoMicroBatchesPerReplica) {
  JobSpec job = valid_job();
  job.parallel.global_batch_size = 1000;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/global_batch_size: 1000 is not divisible by "
                     "micro_batch_size·dp = 1·16 = 16 (nearest valid: 992 or 1008)"});
  job.parallel.global_batch_size = 8;  // fewer sequences than replicas
  EXPECT_EQ(messages(job), Messages{"job.json: /parallel/global_batch_size: 8 is not divisible by "
                                    "micro_batch_size·dp = 1·16 = 16 (nearest valid: 16)"});
}

// Layers that do not fold evenly pass when some uneven split exists (the planner chooses
// one, lib/stage_split_choice.h); a job is refused only when none does.
TEST(JobValidation, LayersMustFoldIntoTwoChunksPerStage) {
  JobSpec job = valid_job();
  job.parallel.dp = 1;
  job.parallel.pp = 3;
  job.parallel.global_batch_size = 64;
  EXPECT_EQ(messages(job), Messages{});  // 32 layers on 3 stages: the planner's split
  job.parallel.pp = 1;
  job.model.num_layers = 33;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/pp: 1 does not split num_layers = 33 into 2·pp = 2 "
                     "equal folded chunks (no pp works for odd num_layers; nearest valid "
                     "num_layers: 32 or 34), and no uneven split exists either (pp >= 3 needs "
                     "num_layers >= 2·pp, pp = 2 num_layers >= 4)"});
  job.parallel.pp = 16;
  job.parallel.tp = 4;
  job.parallel.global_batch_size = 64;
  job.model.num_layers = 30;  // 30 layers cannot give 16 stages two chunks each
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/pp: 16 does not split num_layers = 30 into 2·pp = 32 "
                     "equal folded chunks (valid pp: 1, 3, 5, 15; nearest valid num_layers: "
                     "32), and no uneven split exists either (pp >= 3 needs num_layers >= 2·pp, "
                     "pp = 2 num_layers >= 4)"});
}

// Megatron's account_for flags: refused with decoder_first/last_pipeline_num_layers, and
// when pp does not divide the layers with the embedding and loss counted.
TEST(JobValidation, AccountForFlagsFollowMegatronsRules) {
  JobSpec job = valid_job();  // 32 layers
  job.parallel.dp = 1;
  job.parallel.pp = 2;
  job.parallel.global_batch_size = 64;
  job.parallel.account_for_embedding = true;
  job.parallel.account_for_loss = true;  // 34 layers counted: 17 per stage, odd for the W
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/account_for_embedding_in_pipeline_split: true cannot "
                     "split num_layers = 32 over pp = 2 stages: with both the first and the last "
                     "stage's layers set, pp = 2 leaves no middle stage; the folded layout takes "
                     "its chunk size from the middle stages (use pp >= 3)"});
  job.parallel.pp = 3;  // 34 / 3
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/account_for_embedding_in_pipeline_split: true cannot "
                     "split num_layers = 32 over pp = 3 stages: with the embedding and loss "
                     "counted as layers there are 34 layers, not divisible by pp = 3 "
                     "(Megatron's rule)"});
  job.parallel.account_for_loss = false;  // 33 / 3 = 11: F = 10, b = 11 odd
  EXPECT_EQ(messages(job).size(), 1u);
  job.parallel.pp = 4;
  job.parallel.account_for_loss = true;  // 34 / 4
  job.model.num_layers = 30;             // 32 / 4 = 8: F = La = 7, stage 0 folds 3 + 3
  EXPECT_EQ(messages(job), Messages{});
  job.parallel.first_stage_layers = 7;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/account_for_embedding_in_pipeline_split: true cannot "
                     "split num_layers = 30 over pp = 4 stages: Megatron refuses the account_for "
                     "flags together with decoder_first/last_pipeline_num_layers "
                     "(transformer_config.py: they cannot be set at the same time)"});
}

TEST(JobValidation, SizesMustBePositive) {
  JobSpec job = valid_job();
  job.parallel.tp = 0;
  job.origins["parallel.tp"] = {"<flags>", "--tp"};
  job.parallel.seq_length = 0;
  EXPECT_EQ(messages(job), (Messages{"<flags>: --tp: 0 must be at least 1",
                                     "job.json: /parallel/seq_length: 0 must be at least 1"}));
}

TEST(JobValidation, SizesBeyondTheLimitsAreRefusedBeforeTheyMultiply) {
  // dp = 2^62 with tp = 4 makes dp·tp·cp·pp overflow to 0; every other rule would multiply
  // it, so only the limits are reported.
  JobSpec job = valid_job();
  job.parallel.dp = int64_t{1} << 62;
  job.origins["parallel.dp"] = {"<flags>", "--dp"};
  job.parallel.global_batch_size = int64_t{1} << 62;
  job.parallel.seq_length = int64_t{1} << 25;
  job.parallel.micro_batch_size = (int64_t{1} << 32) + 1;
  EXPECT_EQ(messages(job),
            (Messages{"<flags>: --dp: 4611686018427387904 is more than 1048576, the largest "
                      "parallel size dhelix plans for",
                      "job.json: /parallel/micro_batch_size: 4294967297 is more than 4294967296, "
                      "the largest batch dhelix plans for",
                      "job.json: /parallel/global_batch_size: 4611686018427387904 is more than "
                      "4294967296, the largest batch dhelix plans for",
                      "job.json: /parallel/seq_length: 33554432 is more than 16777216, the "
                      "longest sequence dhelix plans for"}));
}

TEST(JobValidation, WorldSizeIsBoundedWithoutOverflow) {
  JobSpec job = valid_job();
  job.cluster.num_nodes = 0;
  // dp = pp = 2^20, each within its limit: 2^42 GPUs. (dp = pp = 3037000500, whose product
  // overflows int64, stop at the per-dimension limit.)
  job.parallel.dp = 1 << 20;
  job.parallel.pp = 1 << 20;
  job.parallel.global_batch_size = int64_t{1} << 20;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel: world size dp·tp·cp·pp = 1048576·4·1·1048576 = "
                     "4398046511104 is more than 16777216 GPUs, the largest world dhelix plans "
                     "for"});
  // Each size at its limit: the product (2^80) overflows and is not printed.
  job.parallel.tp = 1 << 20;
  job.parallel.cp = 1 << 20;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel: world size dp·tp·cp·pp = "
                     "1048576·1048576·1048576·1048576 is more than 16777216 GPUs, the largest "
                     "world dhelix plans for"});
}

TEST(JobValidation, MicroBatchesPerIterationAreBounded) {
  // 2^32 sequences over dp = 16 at one per micro-batch: 2^28 micro-batches per pipeline, which
  // the O(micro-batches) schedule and simulation would take forever over.
  JobSpec job = valid_job();
  job.parallel.global_batch_size = int64_t{1} << 32;
  job.origins["parallel.global_batch_size"] = {"<flags>", "--gbs"};
  EXPECT_EQ(messages(job),
            Messages{"<flags>: --gbs: 4294967296 gives 4294967296 / (micro_batch_size·dp = 1·16) "
                     "= 268435456 micro-batches per iteration; at most 1048576 are supported"});
  // 2^20 micro-batches, the limit of the count alone, of 32 layers on one stage: the plan's
  // tasks and the programs' layer passes are bounded too (lib/job_limits.h).
  job.parallel.global_batch_size = int64_t{1} << 24;
  EXPECT_EQ(messages(job),
            Messages{"<flags>: --gbs: 16777216 gives 1048576 micro-batches on pp = 1 stages = "
                     "1048576 pipeline tasks; at most 131072 are supported (the plan lists "
                     "every task)"});
  job.parallel.global_batch_size = int64_t{1} << 20;  // 2^16 micro-batches and tasks
  EXPECT_EQ(messages(job),
            Messages{"<flags>: --gbs: 1048576 gives 65536 micro-batches through num_layers = 32 "
                     "layers = 2097152 layer passes per iteration; at most 1048576 are "
                     "supported (each is a run of rank-program instructions)"});
  job.parallel.global_batch_size = int64_t{1} << 19;  // 2^15 micro-batches, 2^20 passes
  EXPECT_EQ(messages(job), Messages{});
}

TEST(JobValidation, PerRankSizesStayBelowTwoToThe52) {
  JobSpec job = valid_job();
  job.model.source_file = "model.json";
  // 2^20 sequences of 8192 tokens in one micro-batch: 2^33 tokens · 2^20 hidden · 2 bytes
  // = 2^54 bytes of activations; logits 2^33 · 2^20 / 4 · 4 = 2^53 bytes.
  job.parallel.micro_batch_size = int64_t{1} << 20;
  job.parallel.global_batch_size = int64_t{1} << 24;
  job.model.hidden_size = 1 << 20;
  job.model.vocab_size = 1 << 20;
  EXPECT_EQ(messages(job),
            (Messages{"model.json: /hidden_size: 1048576 makes one rank's activation tensor "
                      "tokens·hidden_size·bytes = 8589934592·1048576·2 = 1.801e+16 bytes; at "
                      "most 2^52 = 4503599627370496 are supported",
                      "model.json: /vocab_size: 1048576 makes one rank's fp32 logits "
                      "tokens·vocab_size/tp·4 = 8589934592·1048576/4·4 = 9.007e+15 bytes; at "
                      "most 2^52 = 4503599627370496 are supported"}));
  // 2^16 layers of hidden 2^20 (32 heads of 32768, 8 KV heads): per layer 2·h² for Q and O
  // plus 2·h·h/4 for K and V = 2.5·2^40, times 2^16 = 1.801e+17 parameters.
  job = valid_job();
  job.model.source_file = "model.json";
  job.model.hidden_size = 1 << 20;
  job.model.num_layers = 1 << 16;
  job.parallel.global_batch_size = 16;  // one micro-batch: 2^16 layer passes
  EXPECT_EQ(messages(job),
            Messages{"model.json: /num_layers: 65536 gives about 1.801e+17 parameters; at most "
                     "2^52 = 4503599627370496 are supported"});
}

TEST(JobValidation, MessagesNameTheFlagThatSetAValue) {
  JobSpec job = valid_job();
  job.parallel.tp = 3;
  job.parallel.sp = false;
  job.parallel.dp = 1;
  job.parallel.global_batch_size = 64;
  job.origins["parallel.tp"] = {"<flags>", "--tp"};
  EXPECT_EQ(messages(job), (Messages{"<flags>: --tp: 3 does not divide num_attention_heads = 32",
                                     "<flags>: --tp: 3 does not divide num_kv_heads = 8"}));
}

TEST(JobValidation, ReportsEveryProblemAtOnce) {
  JobSpec job = valid_job();
  job.parallel.dp = 2;
  job.parallel.tp = 3;
  job.parallel.pp = 3;
  job.parallel.ep = 2;
  job.parallel.global_batch_size = 1001;
  EXPECT_EQ(
      messages(job),
      (Messages{"job.json: /parallel/tp: 3 does not divide num_attention_heads = 32",
                "job.json: /parallel/tp: 3 does not divide num_kv_heads = 8",
                "job.json: /parallel/ep: 2 requires a mixture-of-experts model (llama-8b is dense)",
                "job.json: /parallel/seq_length: 8192 is not divisible by tp (sequence parallel) "
                "= 3 (nearest valid: 8190 or 8193)",
                "job.json: /parallel/global_batch_size: 1001 is not divisible by "
                "micro_batch_size·dp = 1·2 = 2 (nearest valid: 1000 or 1002)"}));
}

TEST(JobValidation, ThrownErrorListsProblemsOnePerLine) {
  JobSpec job = valid_job();
  job.parallel.tp = 3;
  job.parallel.sp = false;
  job.parallel.dp = 1;
  job.parallel.global_batch_size = 64;
  try {
    validate_job(job).throw_if_any();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_EQ(std::string(error.what()),
              "job.json: /parallel/tp: 3 does not divide num_attention_heads = 32\n"
              "job.json: /parallel/tp: 3 does not divide num_kv_heads = 8");
  }
}

TEST(JobValidation, SequenceLongerThanTheModelIsOnlyAWarning) {
  JobSpec job = valid_job();
  job.parallel.seq_length = 16384;
  EXPECT_EQ(messages(job), Messages{});
  EXPECT_EQ(job_warnings(job),
            Messages{"job.json: /parallel/seq_length: 16384 is longer than llama-8b's "
                     "max_seq_length = 8192 (fine for planning; training needs position "
                     "embeddings that reach that far)"});
  job.parallel.seq_length = 8192;
  EXPECT_EQ(job_warnings(job), Messages{});
}

TEST(JobValidation, OriginDefaultsToTheJobFilePointer) {
  JobSpec job = valid_job();
  EXPECT_EQ(job.origin_of("parallel.global_batch_size").pointer, "/parallel/global_batch_size");
  EXPECT_EQ(job.origin_of("parallel.global_batch_size").file, "job.json");
  EXPECT_EQ(job.num_nodes(), 8);
  job.cluster.num_nodes = 0;
  job.parallel.dp = 3;  // 12 GPUs on 8-GPU nodes: two nodes
  EXPECT_EQ(job.num_nodes(), 2);
}

// ----- activation recompute and uneven pipeline stages -----

// 32 layers on pp 4: F = 6, La = 6 leave 20 for 2 middle stages (10 each, chunks of 5);
// stage 0 of the W keeps 1 + 1. F = 7 leaves 19: refused at the field, with the numbers.
TEST(JobValidation, UnevenStagesFollowTheSplitRules) {
  JobSpec job = valid_job();
  job.parallel.dp = 4;
  job.parallel.pp = 4;
  job.parallel.first_stage_layers = 6;
  job.parallel.last_stage_layers = 6;
  EXPECT_EQ(messages(job), Messages{});
  job.parallel.first_stage_layers = 7;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/decoder_first_pipeline_num_layers: 7 cannot split "
                     "num_layers = 32 over pp = 4 stages: the 19 layers left after the first "
                     "(7) and last (6) stages do not split evenly over the 2 middle stage(s)"});
  // 30 layers, which 2·pp = 8 does not divide, split as 7 + 8 + 8 + 7 (W: 3 + 3 on stage 0).
  job.model.num_layers = 30;
  job.parallel.first_stage_layers = 7;
  job.parallel.last_stage_layers = 7;
  EXPECT_EQ(messages(job), Messages{});
}

TEST(JobValidation, BlockRecomputeNeedsFullGranularity) {
  JobSpec job = valid_job();
  job.parallel.recompute.granularity = RecomputeGranularity::kSelective;
  job.parallel.recompute.method = RecomputeMethod::kBlock;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/recompute_method: \"block\" needs "
                     "recompute_granularity \"full\" (Megatron's rule: selective recompute has "
                     "no method)"});
  job.parallel.recompute.granularity = RecomputeGranularity::kFull;
  job.parallel.recompute.num_layers = 0;
  EXPECT_EQ(messages(job),
            Messages{"job.json: /parallel/recompute_num_layers: 0 must be at least 1"});
}

}  // namespace
}  // namespace dhelix
