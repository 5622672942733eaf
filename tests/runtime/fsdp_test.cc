// Fully sharded data parallelism in the model (runtime/model/fsdp_layers.h): the shard
// layout, the plan's fsdp ops on a DP group of StageModels in one process (collectives
// applied by the test, as the communicators' contract says), against plain data
// parallelism; the release of gathered buffers (use after release reads NaN); the fixed
// order of the gradient sum; the refusals.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/placement.h"
#include "runtime/model/fsdp_layout.h"
#include "runtime/model/stage_model.h"
#include "tests/runtime/error_of.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::test {
namespace {

TEST(FsdpLayoutTest, ShardsAreEvenPaddedAndInMemberOrder) {
  // The file comment's example: tensors of 3, 5 and 2 elements over 4 members.
  const rt::FsdpLayout layout({"a", "b", "c"}, {3, 5, 2}, 4);
  EXPECT_EQ(layout.elements(), 10);
  EXPECT_EQ(layout.shard(), 3);  // ceil(10 / 4)
  EXPECT_EQ(layout.padded(), 12);
  EXPECT_EQ(layout.offsets(), (std::vector<int64_t>{0, 3, 8}));
  std::vector<float> whole(10);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
  EXPECT_EQ(layout.shard_of(whole, 0), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(layout.shard_of(whole, 2), (std::vector<float>{6, 7, 8}));
  EXPECT_EQ(layout.shard_of(whole, 3), (std::vector<float>{9, 0, 0}));  // padding is zero
  EXPECT_EQ(layout.tensor_of(whole, 1), (std::vector<float>{3, 4, 5, 6, 7}));
  // One member: the whole, unpadded.
  const rt::FsdpLayout one({"a"}, {7}, 1);
  EXPECT_EQ(one.shard(), 7);
  EXPECT_EQ(one.padded(), 7);
}

TEST(FsdpLayoutTest, TpSummedRangesAreTheSummedTensorsPartsOfEachShard) {
  // The file comment's example with b summed over TP: elements [3, 8) of the flattened layer.
  const rt::FsdpLayout b({"a", "b", "c"}, {3, 5, 2}, 4, {false, true, false});
  using Ranges = std::vector<rt::ShardRange>;
  EXPECT_EQ(b.tp_summed_ranges(0), Ranges{});
  EXPECT_EQ(b.tp_summed_ranges(1), (Ranges{{0, 3}}));  // elements 3, 4, 5
  EXPECT_EQ(b.tp_summed_ranges(2), (Ranges{{0, 2}}));  // elements 6, 7 (8 is c's)
  EXPECT_EQ(b.tp_summed_ranges(3), Ranges{});
  // a and c summed: member 2 holds b's 6, 7 and c's 8 -> [2, 3); member 3 c's 9 -> [0, 1),
  // not its padding.
  const rt::FsdpLayout ac({"a", "b", "c"}, {3, 5, 2}, 4, {true, false, true});
  EXPECT_EQ(ac.tp_summed_ranges(0), (Ranges{{0, 3}}));
  EXPECT_EQ(ac.tp_summed_ranges(1), Ranges{});
  EXPECT_EQ(ac.tp_summed_ranges(2), (Ranges{{2, 1}}));
  EXPECT_EQ(ac.tp_summed_ranges(3), (Ranges{{0, 1}}));
  // Adjacent summed tensors in one shard merge: b and c over member 2 -> [0, 3).
  const rt::FsdpLayout bc({"a", "b", "c"}, {3, 5, 2}, 4, {false, true, true});
  EXPECT_EQ(bc.tp_summed_ranges(2), (Ranges{{0, 3}}));
  EXPECT_EQ(bc.tp_summed_ranges(3), (Ranges{{0, 1}}));
  // Without flags nothing is summed.
  EXPECT_EQ(rt::FsdpLayout({"a"}, {7}, 2).tp_summed_ranges(0), Ranges{});
}

// The layer of a tiny SP model (tp 2) under FSDP: its norm gains' shard ranges are the ones
// the engine sums over TP, the GEMM weights' none.
TEST(FsdpModelTest, SequenceParallelShardsMarkTheNormGains) {
  JobSpec sp = tiny_job(2, true);
  sp.parallel.dp = 2;
  sp.parallel.global_batch_size = 4;
  rt::StageModel model(sp, 0, {{0, 1}}, false, false, 7, {}, {.enabled = true});
  const rt::FsdpLayout* layout = model.fsdp_layout("layers.0.fsdp_shard");
  ASSERT_NE(layout, nullptr);
  // ln_attn is tensor 0 (member 0's shard starts with it); ln_mlp is tensor 3.
  const int64_t hidden = layout->counts()[0];
  EXPECT_EQ(layout->counts()[3], hidden);
  std::vector<rt::ShardRange> expected{{0, hidden}};
  const int64_t ln_mlp = layout->offsets()[3];
  if (ln_mlp < layout->shard()) {
    expected.push_back({ln_mlp, std::min(hidden, layout->shard() - ln_mlp)});
  }
  EXPECT_EQ(layout->tp_summed_ranges(0), expected);
}

// tiny_llama over dp ranks (tp = 1, pp = 1), micro-batches of 2 sequences of 16.
JobSpec dp_job(int64_t dp, int64_t micro_batches) {
  JobSpec job = tiny_job(1, false);
  job.parallel.dp = dp;
  job.parallel.global_batch_size = 2 * dp * micro_batches;
  return job;
}

// `job` with Megatron-FSDP's optim_grads_params as `fsdp` says: its layer DAGs then hold the
// fsdp ops (lib/dag_builder_fsdp.cc).
JobSpec with_fsdp(JobSpec job, rt::FsdpSettings fsdp) {
  if (!fsdp.enabled) return job;
  job.parallel.use_megatron_fsdp = true;
  job.parallel.fsdp_sharding = FsdpShardingStrategy::kOptimGradsParams;
  job.parallel.fsdp_reshard_after_forward = fsdp.reshard_after_forward;
  return job;
}

// The DP group's StageModels (whole model each), FSDP or not; every op of the layer DAGs
// (the fsdp ops included) run by hand in DAG order.
class DpGroup {
 public:
  DpGroup(const JobSpec& plain_job, rt::FsdpSettings fsdp) {
    const JobSpec job = with_fsdp(plain_job, fsdp);
    const Placement placement(job.parallel, job.cluster.gpus_per_node);
    for (int64_t r = 0; r < job.parallel.dp; ++r) {
      RankCoordinates where;
      where.dp = r;
      models_.push_back(std::make_unique<rt::StageModel>(
          job, placement.rank_of(where),
          std::vector<std::pair<int64_t, int64_t>>{{0, job.model.num_layers}}, true, true, 7,
          rt::CpuBackend::MemoryConfig{}, fsdp));
    }
    dags_ = with_recompute(build_layer_dags(job, 0), job.parallel.recompute.granularity);
    extras_ = build_stage_extras(job, 0, true, true);
    layers_ = job.model.num_layers;
  }

  rt::StageModel& model(int64_t r) { return *models_[static_cast<size_t>(r)]; }
  int64_t size() const { return static_cast<int64_t>(models_.size()); }

  void start(int64_t micro_batches) {
    for (size_t r = 0; r < models_.size(); ++r) {
      models_[r]->start_iteration(micro_batches);
      models_[r]->set_loss_scale(1.0f / static_cast<float>(32 * micro_batches * size()));
      for (int64_t mb = 0; mb < micro_batches; ++mb) {
        models_[r]->set_tokens(mb, random_tokens(32, 256, static_cast<uint32_t>(100 * r + mb)));
      }
    }
  }

  // Binds `op` on every rank and runs it: a collective of an fsdp op across the ranks,
  // another (tp = 1) on each rank alone.
  void run(const std::string& op, int64_t layer, int64_t mb) {
    std::vector<rt::BoundOp> bound;
    for (auto& m : models_) bound.push_back(m->bind(rt::OpRef{op, layer, mb}));
    if (!bound[0].collective) {
      for (rt::BoundOp& b : bound) b.compute({});
      return;
    }
    const bool across = op.find("fsdp") != std::string::npos;
    for (rt::BoundOp& b : bound) {
      if (b.before_collective) b.before_collective({});
    }
    if (across) {
      apply(bound);
    } else {
      for (rt::BoundOp& b : bound) apply_alone(*b.collective);
    }
    for (rt::BoundOp& b : bound) {
      if (b.after_collective) b.after_collective({});
    }
  }

  void forward(int64_t mb) {
    run_extras(extras_.forward, true, mb);
    for (int64_t l = 0; l < layers_; ++l) {
      for (int64_t i : dags_.forward.topological_order()) run(dags_.forward.op(i).id, l, mb);
    }
    run_extras(extras_.forward, false, mb);
  }
  // Layer l's forward ops but its gather.
  void layer_forward_ops(int64_t l, int64_t mb) {
    for (int64_t i : dags_.forward.topological_order()) {
      if (dags_.forward.op(i).id != "fwd.fsdp_gather") run(dags_.forward.op(i).id, l, mb);
    }
  }
  void backward(int64_t mb) {
    run_extras(extras_.backward, false, mb);
    for (int64_t l = layers_ - 1; l >= 0; --l) {
      for (int64_t i : dags_.backward.topological_order()) run(dags_.backward.op(i).id, l, mb);
    }
    run_extras(extras_.backward, true, mb);
  }

 private:
  void run_extras(const LayerDag& dag, bool embedding_part, int64_t mb) {
    for (int64_t i : dag.topological_order()) {
      const std::string& id = dag.op(i).id;
      if ((id.find("embedding") != std::string::npos) == embedding_part) run(id, -1, mb);
    }
  }
  // all_gather: the members' blocks in rank order; reduce_scatter: block r summed in rank
  // order (runtime/comm/communicator.h).
  static void apply(std::vector<rt::BoundOp>& bound) {
    const size_t n = bound.size();
    const int64_t count = bound[0].collective->count;
    std::vector<std::vector<float>> results(n);
    for (size_t r = 0; r < n; ++r) {
      if (bound[0].collective->kind == rt::CollectiveKind::kAllGather) {
        for (const rt::BoundOp& b : bound) {
          results[r].insert(results[r].end(), b.collective->in_f32(),
                            b.collective->in_f32() + count);
        }
      } else {
        ASSERT_EQ(bound[0].collective->kind, rt::CollectiveKind::kReduceScatter);
        results[r].assign(static_cast<size_t>(count), 0.0f);
        for (const rt::BoundOp& b : bound) {
          for (int64_t i = 0; i < count; ++i) {
            results[r][static_cast<size_t>(i)] +=
                b.collective->in_f32()[static_cast<int64_t>(r) * count + i];
          }
        }
      }
    }
    for (size_t r = 0; r < n; ++r) {
      std::copy(results[r].begin(), results[r].end(), bound[r].collective->out_f32());
    }
  }
  static void apply_alone(const rt::CollectiveRequest& request) {
    if (request.kind == rt::CollectiveKind::kAllReduce) return;
    std::copy(request.in_f32(), request.in_f32() + request.count, request.out_f32());
  }

  std::vector<std::unique_ptr<rt::StageModel>> models_;
  LayerDags dags_, extras_;
  int64_t layers_ = 0;
};

// The whole tensor `name` of a sharded layer: every rank's shard view, gathered.
std::vector<float> gathered(DpGroup& group, int64_t layer, const std::string& name, bool gradient) {
  const std::string view = "layers." + std::to_string(layer) + ".fsdp_shard";
  std::vector<float> whole;
  const rt::FsdpLayout* layout = group.model(0).fsdp_layout(view);
  EXPECT_NE(layout, nullptr);
  for (int64_t r = 0; r < group.size(); ++r) {
    for (const rt::ParameterView& p : group.model(r).parameters()) {
      if (p.name != view) continue;
      EXPECT_TRUE(p.fsdp_shard);
      const float* data = gradient ? p.gradient : p.values;
      whole.insert(whole.end(), data, data + p.count);
    }
  }
  for (size_t t = 0; t < layout->names().size(); ++t) {
    if (layout->names()[t] == name) return layout->tensor_of(whole, t);
  }
  ADD_FAILURE() << name;
  return {};
}

std::vector<float> values_of(rt::StageModel& model, const std::string& name) {
  for (const rt::ParameterView& p : model.parameters()) {
    if (p.name == name) return {p.values, p.values + p.count};
  }
  ADD_FAILURE() << name;
  return {};
}

// Plain DP's summed gradient of `name`: every rank's local one, summed in rank order.
std::vector<float> summed(DpGroup& group, const std::string& name) {
  std::vector<float> sum;
  for (int64_t r = 0; r < group.size(); ++r) {
    for (const rt::ParameterView& p : group.model(r).parameters()) {
      if (p.name != name) continue;
      if (sum.empty()) sum.assign(static_cast<size_t>(p.count), 0.0f);
      for (int64_t i = 0; i < p.count; ++i) sum[static_cast<size_t>(i)] += p.gradient[i];
    }
  }
  return sum;
}

const std::vector<std::string> kTensors = {"ln_attn", "w_qkv", "w_proj",
                                           "ln_mlp",  "w_fc1", "w_fc2"};

void one_step(DpGroup& group, int64_t micro_batches, bool reversed_backward = false) {
  group.start(micro_batches);
  for (int64_t mb = 0; mb < micro_batches; ++mb) group.forward(mb);
  for (int64_t i = 0; i < micro_batches; ++i) {
    group.backward(reversed_backward ? micro_batches - 1 - i : i);
  }
  for (int64_t r = 0; r < group.size(); ++r) group.model(r).finish_iteration();
}

// One micro-batch: the reduce-scatter adds the ranks' gradients in rank order into a zero
// shard, the all-reduce of plain DP the same: bit for bit, as are weights and losses.
TEST(FsdpModelTest, OneMicroBatchEqualsPlainDataParallelBitForBit) {
  for (const bool reshard : {true, false}) {
    SCOPED_TRACE(reshard ? "reshard_after_forward" : "kept");
    const JobSpec job = dp_job(3, 1);  // 3 ranks: the layers' sizes are no multiple of 3
    DpGroup fsdp(job, {.enabled = true, .reshard_after_forward = reshard});
    DpGroup plain(job, {});
    one_step(fsdp, 1);
    one_step(plain, 1);
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(fsdp.model(r).micro_batch_losses(), plain.model(r).micro_batch_losses());
    }
    for (int64_t l = 0; l < 2; ++l) {
      for (const std::string& t : kTensors) {
        const std::string name = "layers." + std::to_string(l) + "." + t;
        EXPECT_EQ(gathered(fsdp, l, name, false), values_of(plain.model(0), name)) << name;
        EXPECT_EQ(gathered(fsdp, l, name, true), summed(plain, name)) << name;
      }
    }
    EXPECT_EQ(summed(fsdp, "head"), summed(plain, "head"));  // extras: not sharded
  }
}

// Activation recompute repeats the forward in the backward: on the backward's gathered
// weights (reshard) or the kept ones, with the same bits as plain DP with recompute.
TEST(FsdpModelTest, RecomputeReadsTheBackwardsGatheredWeights) {
  for (const RecomputeGranularity granularity :
       {RecomputeGranularity::kFull, RecomputeGranularity::kSelective}) {
    for (const bool reshard : {true, false}) {
      JobSpec job = dp_job(2, 1);
      job.parallel.recompute.granularity = granularity;
      DpGroup fsdp(job, {.enabled = true, .reshard_after_forward = reshard});
      DpGroup plain(job, {});
      one_step(fsdp, 1);
      one_step(plain, 1);
      for (const std::string& t : kTensors) {
        const std::string name = "layers.1." + t;
        EXPECT_EQ(gathered(fsdp, 1, name, true), summed(plain, name)) << name;
      }
    }
  }
}

// Several micro-batches: the shard's gradient is the sum of the reduced shards in
// micro-batch order whatever order the backwards ran in (bitwise), and plain DP's within
// the tolerance of docs/kernels.md (the additions reassociated).
TEST(FsdpModelTest, MicroBatchesSumInAFixedOrderAndMatchPlainDataParallel) {
  const JobSpec job = dp_job(2, 3);
  DpGroup in_order(job, {.enabled = true}), reversed(job, {.enabled = true}), plain(job, {});
  one_step(in_order, 3);
  one_step(reversed, 3, true);
  one_step(plain, 3);
  for (int64_t l = 0; l < 2; ++l) {
    for (const std::string& t : kTensors) {
      const std::string name = "layers." + std::to_string(l) + "." + t;
      const std::vector<float> a = gathered(in_order, l, name, true);
      EXPECT_EQ(a, gathered(reversed, l, name, true)) << name;
      const std::vector<float> b = summed(plain, name);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i], b[i], 1e-6f + 1e-5f * std::fabs(b[i])) << name << "[" << i << "]";
      }
    }
  }
}

// With reshard_after_forward the forward's whole weights are released (NaN) after the
// layer's last forward op: running the layer's forward again on them makes its output NaN.
// Kept weights (reshard false) live on to the backward: the same output again, bit for bit.
TEST(FsdpModelTest, UseAfterReleaseReadsNaN) {
  for (const bool reshard : {true, false}) {
    SCOPED_TRACE(reshard ? "reshard_after_forward" : "kept");
    DpGroup group(dp_job(2, 1), {.enabled = true, .reshard_after_forward = reshard});
    group.start(1);
    group.forward(0);
    const float* out = group.model(0).residual(0, 1);  // layer 0's output
    const std::vector<float> first(out, out + group.model(0).boundary_elements());
    for (const float v : first) ASSERT_TRUE(std::isfinite(v));
    group.layer_forward_ops(0, 0);  // no gather before it
    const std::vector<float> again(out, out + group.model(0).boundary_elements());
    if (reshard) {
      EXPECT_TRUE(std::all_of(again.begin(), again.end(), [](float v) { return std::isnan(v); }));
    } else {
      EXPECT_EQ(again, first);
    }
    // The backward releases what is left: after it, the layer's forward reads NaN either way.
    group.backward(0);
    group.layer_forward_ops(0, 0);
    EXPECT_TRUE(std::isnan(out[0]));
  }
}

// The whole gradient is released (NaN) by the reduce-scatter; one that runs before any
// gradient op of its micro-batch would send that poison: refused by name.
TEST(FsdpModelTest, ReduceScatterBeforeTheGradientOpsIsRefused) {
  DpGroup group(dp_job(2, 1), {.enabled = true});
  group.start(1);
  group.forward(0);
  rt::BoundOp early = group.model(0).bind(rt::OpRef{"bwd.fsdp_reduce_scatter", 1, 0});
  ASSERT_TRUE(early.before_collective);
  const auto [code, message] = error_of([&] { early.before_collective({}); });
  EXPECT_EQ(code, ErrorCode::kInternal);
  EXPECT_NE(message.find("bwd.fsdp_reduce_scatter of layer 1 micro-batch 0"), std::string::npos)
      << message;
  // And an iteration whose reduce-scatter never ran does not finish.
  const auto [code2, message2] = error_of([&] { group.model(0).finish_iteration(); });
  EXPECT_EQ(code2, ErrorCode::kInternal);
  EXPECT_NE(message2.find("not reduce-scattered"), std::string::npos) << message2;
}

TEST(FsdpModelTest, OpsAndSettingsItDoesNotRunAreRefusedByName) {
  // bwd.fsdp_gather when the plan keeps the gathered weights.
  DpGroup kept(dp_job(2, 1), {.enabled = true, .reshard_after_forward = false});
  auto [code, message] = error_of([&] { kept.model(0).bind(rt::OpRef{"bwd.fsdp_gather", 0, 0}); });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_NE(message.find("reshard_after_forward false"), std::string::npos) << message;
  // Full recompute's repeat gathers nothing of its own (lib/dag_builder_recompute.cc).
  JobSpec full = dp_job(2, 1);
  full.parallel.recompute.granularity = RecomputeGranularity::kFull;
  DpGroup recompute(full, {.enabled = true});
  EXPECT_THROW(recompute.model(0).bind(rt::OpRef{"bwd.recompute.fsdp_gather", 0, 0}), Error);
  // FSDP ops on a model without FSDP.
  DpGroup plain(dp_job(2, 1), {});
  std::tie(code, message) = error_of([&] {
    plain.model(0).bind(rt::OpRef{"fwd.fsdp_gather", 0, 0});
  });
  EXPECT_EQ(code, ErrorCode::kInvalidInput);
  EXPECT_NE(message.find("holds no FSDP shard"), std::string::npos) << message;
  // Context parallelism (sequence parallelism runs: FsdpLayoutTest's TP-summed ranges).
  JobSpec cp = tiny_job(1, false);
  cp.parallel.cp = 2;
  std::tie(code, message) = error_of([&] {
    rt::StageModel model(cp, 0, {{0, 2}}, true, true, 7, {}, {.enabled = true});
  });
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(message.find("context parallelism (cp = 2)"), std::string::npos) << message;
}

}  // namespace
}  // namespace dhelix::test
