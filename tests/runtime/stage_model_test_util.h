#pragma once
// Helpers of the StageModel tests: tiny Llama jobs built in code, and a TP group of
// StageModels in one process whose collectives are applied by the test itself, following
// the Communicator's contract (runtime/comm/communicator.h): all_gather concatenates the
// members' blocks in rank order, reduce_scatter gives member r the sum (in rank order
// 0, 1, ...) of block r, all_reduce sums in rank order in place.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/job_spec.h"
#include "lib/placement.h"
#include "runtime/model/stage_model.h"

namespace dhelix::test {

/// A 2-layer Llama: hidden 64, 4 heads of 16, 2 KV heads, FFN 128, vocabulary 256.
inline ModelSpec tiny_llama() {
  ModelSpec m;
  m.name = "llama-tiny";
  m.source_file = "model.json";
  m.hidden_size = 64;
  m.ffn_hidden_size = 128;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.vocab_size = 256;
  m.max_seq_length = 64;
  m.dtype = DType::kFp32;
  return m;
}

/// One pipeline stage (pp = 1, dp = 1) of tiny_llama with `tp` ranks, 2 sequences of 16.
inline JobSpec tiny_job(int64_t tp, bool sp) {
  JobSpec job;
  job.name = "tiny";
  job.source_file = "job.json";
  job.model = tiny_llama();
  job.parallel.tp = tp;
  job.parallel.sp = sp;
  job.parallel.micro_batch_size = 2;
  job.parallel.global_batch_size = 2;
  job.parallel.seq_length = 16;
  return job;
}

/// Tokens in [0, vocab) and their targets (the next token of a longer random stream).
inline rt::MicroBatchTokens random_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> stream(static_cast<size_t>(count + 1));
  for (int32_t& token : stream) token = pick(engine);
  rt::MicroBatchTokens tokens;
  tokens.tokens.assign(stream.begin(), stream.end() - 1);
  tokens.targets.assign(stream.begin() + 1, stream.end());
  return tokens;
}

/// The StageModels of one TP group on backend B: by default the whole model (embedding,
/// every layer, head); otherwise the layers [first_layer, first_layer + layers) of pipeline
/// stage `stage`. Ops run with `exec` (the CUDA backend's stream and cuBLAS handle); the
/// test applies collectives on the host, so a device backend is limited to tp = 1.
template <class B>
class BasicTpGroup {
 public:
  using Model = rt::BasicStageModel<B>;
  using BoundOp = rt::BasicBoundOp<B>;

  BasicTpGroup(const JobSpec& job, uint64_t seed, int64_t stage = 0, int64_t first_layer = 0,
               int64_t layers = -1, bool embedding = true, bool head = true,
               typename B::MemoryConfig memory = {}, typename B::Exec exec = {})
      : job_(job),
        first_layer_(first_layer),
        layers_(layers < 0 ? job.model.num_layers : layers),
        embedding_(embedding),
        head_(head),
        exec_(exec) {
    const Placement placement(job.parallel, job.cluster.gpus_per_node);
    for (int64_t r = 0; r < job.parallel.tp; ++r) {
      RankCoordinates where;
      where.tp = r;
      where.pp = stage;
      models_.push_back(
          std::make_unique<Model>(job, placement.rank_of(where),
                                  std::vector<std::pair<int64_t, int64_t>>{{first_layer_, layers_}},
                                  embedding, head, seed, memory));
    }
    const int64_t rank = placement.rank_of(RankCoordinates{});
    dags_ = with_recompute(build_layer_dags(job, rank), job.parallel.recompute.granularity);
    extras_ = build_stage_extras(job, rank, true, true);
  }

  int64_t size() const { return static_cast<int64_t>(models_.size()); }
  Model& model(int64_t r) { return *models_[static_cast<size_t>(r)]; }

  void start_iteration(int64_t micro_batches) {
    for (auto& m : models_) m->start_iteration(micro_batches);
  }
  void set_tokens(int64_t mb, const rt::MicroBatchTokens& tokens) {
    for (auto& m : models_) m->set_tokens(mb, tokens);
  }

  /// Binds `op` on every rank and runs it (a collective across the ranks' buffers).
  void run(const std::string& op, int64_t layer, int64_t mb) {
    std::vector<BoundOp> bound;
    for (auto& m : models_) bound.push_back(m->bind(rt::OpRef{op, layer, mb}));
    if (!bound[0].collective) {
      for (BoundOp& b : bound) {
        ASSERT_TRUE(b.compute) << op;
        b.compute(exec_);
      }
      return;
    }
    std::vector<rt::CollectiveRequest> requests;
    for (BoundOp& b : bound) {
      ASSERT_TRUE(b.collective.has_value()) << op;
      ASSERT_EQ(b.collective->kind, bound[0].collective->kind) << op;
      ASSERT_EQ(b.collective->count, bound[0].collective->count) << op;
      requests.push_back(*b.collective);
    }
    apply(requests);
    for (BoundOp& b : bound) {
      if (b.after_collective) b.after_collective(exec_);
    }
  }

  /// One micro-batch's forward: embedding chain, the layers, head chain (DAG orders).
  void forward(int64_t mb) {
    if (embedding_) run_extras(extras_.forward, true, mb);
    for (int64_t layer = first_layer_; layer < first_layer_ + layers_; ++layer) {
      for (int64_t i : dags_.forward.topological_order()) run(dags_.forward.op(i).id, layer, mb);
    }
    if (head_) run_extras(extras_.forward, false, mb);
  }

  /// One micro-batch's backward: loss and head chain, layers from the last, embedding.
  /// Ops whose id starts with `skip` (when not empty) are left out.
  void backward(int64_t mb, const std::string& skip = "") {
    if (head_) run_extras(extras_.backward, false, mb);
    for (int64_t layer = first_layer_ + layers_ - 1; layer >= first_layer_; --layer) {
      for (int64_t i : dags_.backward.topological_order()) {
        const std::string& id = dags_.backward.op(i).id;
        if (skip.empty() || !id.starts_with(skip)) run(id, layer, mb);
      }
    }
    if (embedding_) run_extras(extras_.backward, true, mb);
  }

  /// Every op id the group's DAGs hold (layer and extras, both passes).
  std::vector<std::string> op_ids() const {
    std::vector<std::string> ids;
    for (const LayerDag* dag :
         {&dags_.forward, &dags_.backward, &extras_.forward, &extras_.backward}) {
      for (int64_t i = 0; i < dag->size(); ++i) ids.push_back(dag->op(i).id);
    }
    return ids;
  }

 private:
  void run_extras(const LayerDag& dag, bool embedding_part, int64_t mb) {
    for (int64_t i : dag.topological_order()) {
      const std::string& id = dag.op(i).id;
      if ((id.find("embedding") != std::string::npos) == embedding_part) run(id, -1, mb);
    }
  }

  static void apply(const std::vector<rt::CollectiveRequest>& requests) {
    const size_t n = requests.size();
    const int64_t count = requests[0].count;
    std::vector<std::vector<float>> results(n);
    for (size_t r = 0; r < n; ++r) {
      switch (requests[0].kind) {
        case rt::CollectiveKind::kAllGather:
          for (const rt::CollectiveRequest& q : requests) {
            results[r].insert(results[r].end(), q.in_f32(), q.in_f32() + count);
          }
          break;
        case rt::CollectiveKind::kReduceScatter:
          results[r].assign(static_cast<size_t>(count), 0.0f);
          for (const rt::CollectiveRequest& q : requests) {
            for (int64_t i = 0; i < count; ++i) {
              results[r][static_cast<size_t>(i)] += q.in_f32()[static_cast<int64_t>(r) * count + i];
            }
          }
          break;
        case rt::CollectiveKind::kAllToAllV:  // expert parallelism: not in the TP harness
          throw std::logic_error("all_to_all_v in the tensor-parallel test harness");
        case rt::CollectiveKind::kAllReduce:
          results[r].assign(static_cast<size_t>(count), 0.0f);
          for (const rt::CollectiveRequest& q : requests) {
            for (int64_t i = 0; i < count; ++i)
              results[r][static_cast<size_t>(i)] += q.out_f32()[i];
          }
          break;
        case rt::CollectiveKind::kRingExchange: {  // from the previous member
          const float* in = requests[(r + n - 1) % n].in_f32();
          results[r].assign(in, in + count);
          break;
        }
      }
    }
    for (size_t r = 0; r < n; ++r)
      std::copy(results[r].begin(), results[r].end(), requests[r].out_f32());
  }

  JobSpec job_;
  int64_t first_layer_, layers_;
  bool embedding_, head_;
  typename B::Exec exec_;
  std::vector<std::unique_ptr<Model>> models_;
  LayerDags dags_;
  LayerDags extras_;
};

using TpGroup = BasicTpGroup<rt::CpuBackend>;

}  // namespace dhelix::test
