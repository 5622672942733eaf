// runtime/model/moe_layers_cpu.h without EP: the plan's MoE ops, bound and run one by one
// in the DAG's order, compute exactly (bit for bit) what the tested MoE functions of
// runtime/cpu/moe_cpu.h compute in one call, forward and backward, with token copies
// dropped at capacity. EP 2 against EP 1 is tests/e2e/run_test.sh (the same losses).

#include "runtime/model/moe_layers_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cpu/moe_cpu.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> pick(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = pick(engine);
  return values;
}

void run(MoeLayersCpu& moe, const std::string& op, const MoeLayerIo& io) {
  SCOPED_TRACE(op);
  std::optional<BoundOp> bound = moe.bind(op, /*layer=*/0, /*micro_batch=*/0, io);
  ASSERT_TRUE(bound.has_value());
  ASSERT_TRUE(bound->compute);
  bound->compute(CpuBackend::Exec{});
}

void run_recomputing(MoeLayersCpu& moe, const std::string& op, const MoeLayerIo& io) {
  SCOPED_TRACE(op);
  std::optional<BoundOp> bound =
      moe.bind(op, /*layer=*/0, /*micro_batch=*/0, io, /*recomputing=*/true);
  ASSERT_TRUE(bound.has_value());
  ASSERT_TRUE(bound->compute);
  bound->compute(CpuBackend::Exec{});
}

bool same_bits(const std::vector<float>& a, const float* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

TEST(MoeLayersCpu, BoundOpsComputeWhatTheMoeFunctionsComputeWithTokensDropped) {
  JobSpec job = test::tiny_job(/*tp=*/1, /*sp=*/false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 1.0,
                          .expert_ffn_hidden_size = 32,
                          .shared_expert_ffn_hidden_size = 0,
                          .aux_loss_coeff = 0.01};
  const int64_t t = 32, h = 64;  // 2 sequences of 16, hidden 64
  const float loss_scale = 1.0f / static_cast<float>(t);
  MoeLayersCpu moe(job, /*rank=*/0, {0}, /*seed=*/7, &loss_scale);
  const std::vector<ParameterView> params = moe.parameters(0);
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].name, "layers.0.router");
  EXPECT_FALSE(params[0].expert);
  EXPECT_TRUE(params[1].expert && params[2].expert);
  EXPECT_EQ(params[1].count, 4 * 2 * 32 * h);  // every expert on the one EP rank

  const std::vector<float> x = random_values(t * h, 1), dy = random_values(t * h, 2);
  std::vector<float> y(static_cast<size_t>(t * h)), dx(y.size());
  const MoeLayerIo io{.x = x.data(), .y = y.data(), .dy = dy.data(), .dx = dx.data()};
  for (const char* op :
       {"fwd.router", "fwd.permute", "fwd.grouped_fc1", "fwd.swiglu", "fwd.grouped_fc2",
        "fwd.unpermute", "bwd.unpermute", "bwd.grouped_fc2_dgrad", "bwd.grouped_fc2_wgrad",
        "bwd.swiglu", "bwd.grouped_fc1_dgrad", "bwd.grouped_fc1_wgrad", "bwd.permute", "bwd.router",
        "bwd.router_wgrad"}) {
    run(moe, op, io);
  }
  moe.sum_input_gradient(0, 0, io)(CpuBackend::Exec{});

  // The same layer in single calls of the tested functions.
  const cpu::MoeLayerShape s{.tokens = t,
                             .hidden = h,
                             .experts = 4,
                             .top_k = 2,
                             .ffn = 32,
                             .capacity_factor = 1.0,
                             .aux_loss_coeff = 0.01};
  cpu::MoeRouting r;
  cpu::moe_route(s, x.data(), params[0].values, r);
  EXPECT_GT(r.dropped, 0) << "capacity 1.0 drops copies of an unbalanced routing";
  EXPECT_EQ(moe.dropped_copies(), r.dropped);
  EXPECT_EQ(moe.aux_loss_sum(1), r.aux_loss);
  EXPECT_EQ(moe.aux_loss_sum(0), 0.0f);
  const int64_t slots = r.slots();
  EXPECT_EQ(slots + r.dropped, t * 2);
  std::vector<float> permuted(static_cast<size_t>(slots * h)), fc1(static_cast<size_t>(slots * 64)),
      act(static_cast<size_t>(slots * 32)), out(permuted.size()), y_ref(y.size());
  cpu::moe_permute(s, r, x.data(), permuted.data());
  cpu::moe_experts_forward(s, r.expert_rows, permuted.data(), params[1].values, params[2].values,
                           fc1.data(), act.data(), out.data());
  cpu::moe_unpermute(s, r, out.data(), y_ref.data());
  EXPECT_TRUE(same_bits(y_ref, y.data())) << "forward output";

  std::vector<float> d_out(out.size()), dgate(static_cast<size_t>(t * 2)), d_in(out.size());
  std::vector<float> dw1(static_cast<size_t>(params[1].count)),
      dw2(static_cast<size_t>(params[2].count));
  std::vector<float> dwr(static_cast<size_t>(params[0].count)), dx_ref(y.size());
  cpu::moe_unpermute_backward(s, r, dy.data(), out.data(), d_out.data(), dgate.data());
  cpu::moe_experts_backward(s, r.expert_rows, permuted.data(), params[1].values, params[2].values,
                            fc1.data(), act.data(), d_out.data(), d_in.data(), dw1.data(),
                            dw2.data());
  cpu::moe_permute_backward(s, r, d_in.data(), dx_ref.data());
  // The aux loss's weight: loss_scale x T, one micro-batch's mean.
  cpu::moe_router_backward(s, r, x.data(), params[0].values, dgate.data(), 1.0f, dx_ref.data(),
                           dwr.data());
  EXPECT_TRUE(same_bits(dx_ref, dx.data())) << "input gradient";
  EXPECT_TRUE(same_bits(dwr, params[0].gradient)) << "router gradient";
  EXPECT_TRUE(same_bits(dw1, params[1].gradient)) << "experts' fc1 gradient";
  EXPECT_TRUE(same_bits(dw2, params[2].gradient)) << "experts' fc2 gradient";

  // Without EP the plan has no all-to-all; binding one is a caller's error.
  try {
    moe.bind("fwd.dispatch_a2a", 0, 0, io);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(), "StageModel: op fwd.dispatch_a2a does not occur with ep = 1");
  }
  EXPECT_FALSE(moe.bind("fwd.gemm_fc1", 0, 0, io).has_value());
}

// With a shared expert (its sigmoid gate included) and no capacity limit nor aux loss (so
// that the loss is smooth where it is probed): L = <y, dy>; the bound backward's input
// gradient and the shared expert's weight gradients match central differences.
TEST(MoeLayersCpu, SharedExpertGradientsMatchFiniteDifferences) {
  JobSpec job = test::tiny_job(/*tp=*/1, /*sp=*/false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 0.0,
                          .expert_ffn_hidden_size = 16,
                          .shared_expert_ffn_hidden_size = 24,
                          .aux_loss_coeff = 0.0};
  const int64_t t = 32, h = 64;
  const float loss_scale = 1.0f / static_cast<float>(t);
  MoeLayersCpu moe(job, 0, {0}, 11, &loss_scale);
  const std::vector<ParameterView> params = moe.parameters(0);
  ASSERT_EQ(params.size(), 6u);
  EXPECT_EQ(params[3].name, "layers.0.shared_gate");
  EXPECT_EQ(params[4].count, 2 * 24 * h);
  std::vector<float> x = random_values(t * h, 3);
  const std::vector<float> dy = random_values(t * h, 4);
  std::vector<float> y(x.size()), dx(x.size());
  const MoeLayerIo io{.x = x.data(), .y = y.data(), .dy = dy.data(), .dx = dx.data()};
  const std::vector<std::string> forward = {
      "fwd.router",    "fwd.permute",    "fwd.grouped_fc1",   "fwd.swiglu",    "fwd.grouped_fc2",
      "fwd.unpermute", "fwd.shared_fc1", "fwd.shared_swiglu", "fwd.shared_fc2"};
  std::vector<BoundOp> bound;
  for (const std::string& op : forward) bound.push_back(*moe.bind(op, 0, 0, io));
  auto loss = [&] {
    for (BoundOp& op : bound) op.compute(CpuBackend::Exec{});
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * dy[i];
    return sum;
  };
  loss();
  for (const char* op :
       {"bwd.shared_fc2_wgrad", "bwd.shared_fc2_dgrad", "bwd.shared_swiglu", "bwd.shared_fc1_dgrad",
        "bwd.shared_fc1_wgrad", "bwd.unpermute", "bwd.grouped_fc2_dgrad", "bwd.grouped_fc2_wgrad",
        "bwd.swiglu", "bwd.grouped_fc1_dgrad", "bwd.grouped_fc1_wgrad", "bwd.permute", "bwd.router",
        "bwd.router_wgrad"}) {
    run(moe, op, io);
  }
  moe.sum_input_gradient(0, 0, io)(CpuBackend::Exec{});
  // d L / d v by central differences for element i of `values`.
  auto numeric = [&](float* values, int64_t i) {
    const float keep = values[i], eps = 1e-2f;
    values[i] = keep + eps;
    const double up = loss();
    values[i] = keep - eps;
    const double down = loss();
    values[i] = keep;
    return (up - down) / (2.0 * eps);
  };
  auto expect_close = [](double numeric_grad, float analytic, const std::string& what) {
    EXPECT_NEAR(analytic, numeric_grad, 2e-2 * std::abs(numeric_grad) + 2e-3) << what;
  };
  for (int64_t i : {0, 5, 130, 1000, 2047}) {
    expect_close(numeric(x.data(), i), dx[static_cast<size_t>(i)], "dx " + std::to_string(i));
  }
  for (size_t p = 3; p < 6; ++p) {
    for (int64_t i : {int64_t{0}, int64_t{7}, params[p].count - 1}) {
      expect_close(numeric(params[p].values, i), params[p].gradient[i],
                   params[p].name + " " + std::to_string(i));
    }
  }
}

// Full recompute: the repeated forward (bwd.recompute.<op>, bound with `recomputing`) fills
// a second set of buffers, which the backward then reads; the outputs, input gradient and
// weight gradients are those of a run that stores its activations, bit for bit, and the
// load-balancing loss is counted once.
TEST(MoeLayersCpu, FullRecomputeRepeatsTheForwardInBuffersOfItsOwn) {
  JobSpec job = test::tiny_job(/*tp=*/1, /*sp=*/false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 1.0,
                          .expert_ffn_hidden_size = 32,
                          .shared_expert_ffn_hidden_size = 0,
                          .aux_loss_coeff = 0.01};
  const int64_t t = 32, h = 64;
  const float loss_scale = 1.0f / static_cast<float>(t);
  const std::vector<float> x = random_values(t * h, 11), dy = random_values(t * h, 12);
  const std::vector<const char*> forward = {"fwd.router", "fwd.permute",     "fwd.grouped_fc1",
                                            "fwd.swiglu", "fwd.grouped_fc2", "fwd.unpermute"};
  const std::vector<const char*> backward = {
      "bwd.unpermute",         "bwd.grouped_fc2_dgrad", "bwd.grouped_fc2_wgrad", "bwd.swiglu",
      "bwd.grouped_fc1_dgrad", "bwd.grouped_fc1_wgrad", "bwd.permute",           "bwd.router",
      "bwd.router_wgrad"};
  // Stored: forward, then backward on the forward's buffers.
  MoeLayersCpu stored(job, 0, {0}, /*seed=*/5, &loss_scale);
  std::vector<float> y(static_cast<size_t>(t * h)), dx(y.size());
  const MoeLayerIo io{.x = x.data(), .y = y.data(), .dy = dy.data(), .dx = dx.data()};
  for (const char* op : forward) run(stored, op, io);
  for (const char* op : backward) run(stored, op, io);
  stored.sum_input_gradient(0, 0, io)(CpuBackend::Exec{});
  // Recomputed: forward, the repeat into another output, then backward on the repeat's.
  MoeLayersCpu recomputed(job, 0, {0}, /*seed=*/5, &loss_scale);
  std::vector<float> y1(y.size()), y2(y.size()), dx2(y.size());
  const MoeLayerIo first{.x = x.data(), .y = y1.data(), .dy = dy.data(), .dx = nullptr};
  const MoeLayerIo repeat{.x = x.data(), .y = y2.data(), .dy = dy.data(), .dx = dx2.data()};
  for (const char* op : forward) run(recomputed, op, first);
  const float aux = recomputed.aux_loss_sum(1);
  for (const char* op : forward) run_recomputing(recomputed, op, repeat);
  for (const char* op : backward) run_recomputing(recomputed, op, repeat);
  recomputed.sum_input_gradient(0, 0, repeat, /*recomputing=*/true)(CpuBackend::Exec{});

  EXPECT_TRUE(same_bits(y, y1.data()));
  EXPECT_TRUE(same_bits(y, y2.data()));
  EXPECT_TRUE(same_bits(dx, dx2.data()));
  EXPECT_GT(aux, 0.0f);
  EXPECT_EQ(recomputed.aux_loss_sum(1), aux);  // the repeat's is not added
  EXPECT_EQ(recomputed.aux_loss_sum(1), stored.aux_loss_sum(1));
  // The repeat's routing is its own: repeating on other rows leaves the first forward's.
  const std::vector<float> other = random_values(t * h, 13);
  const MoeLayerIo elsewhere{.x = other.data(), .y = y2.data(), .dy = dy.data(), .dx = nullptr};
  for (const char* op : forward) run_recomputing(recomputed, op, elsewhere);
  EXPECT_EQ(recomputed.aux_loss_sum(1), aux);
  const std::vector<ParameterView> a = stored.parameters(0), b = recomputed.parameters(0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    EXPECT_EQ(std::memcmp(a[p].gradient, b[p].gradient, sizeof(float) * a[p].count), 0)
        << a[p].name;
  }
}

// Expert tensor parallelism (etp = tp = 2): TP rank r holds the gate rows [16 r, +16) and
// the up rows 32 + [16 r, +16) of every expert's fc1 [64, h], and the columns [16 r, +16)
// of its fc2 [h, 32], with the values of the whole experts that etp = 1 holds on every TP
// rank; the router is replicated. Gradients: the router's summed over TP (each TP rank
// routes its own sequence-parallel rows), the experts' over TP only with etp = 1.
TEST(MoeLayersCpu, ExpertTensorParallelSlicesTheWholeExperts) {
  auto job_with = [](int64_t expert_tp) {
    JobSpec job = test::tiny_job(/*tp=*/2, /*sp=*/true);
    job.model.moe = MoeSpec{.num_experts = 4,
                            .top_k = 2,
                            .capacity_factor = 0.0,
                            .expert_ffn_hidden_size = 32,
                            .shared_expert_ffn_hidden_size = 0,
                            .aux_loss_coeff = 0.01};
    job.parallel.expert_tp = expert_tp;
    return job;
  };
  const float loss_scale = 1.0f;
  const JobSpec whole_job = job_with(1), sliced_job = job_with(2);
  MoeLayersCpu whole(whole_job, /*rank=*/0, {1}, /*seed=*/3, &loss_scale);
  const std::vector<ParameterView> w = whole.parameters(1);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_TRUE(w[0].sum_gradient_over_tp && w[1].sum_gradient_over_tp && w[2].sum_gradient_over_tp);
  const int64_t h = 64, f = 32, half = 16, experts = 4;
  ASSERT_EQ(w[1].count, experts * 2 * f * h);
  for (int64_t tp_rank = 0; tp_rank < 2; ++tp_rank) {
    SCOPED_TRACE(tp_rank);
    MoeLayersCpu sliced(sliced_job, /*rank=*/tp_rank, {1}, /*seed=*/3, &loss_scale);
    const std::vector<ParameterView> v = sliced.parameters(1);
    ASSERT_EQ(v.size(), 3u);
    EXPECT_TRUE(v[0].sum_gradient_over_tp);
    EXPECT_FALSE(v[1].sum_gradient_over_tp || v[2].sum_gradient_over_tp);
    EXPECT_TRUE(v[1].expert && v[2].expert);
    ASSERT_EQ(v[0].count, w[0].count);
    EXPECT_EQ(std::memcmp(v[0].values, w[0].values, sizeof(float) * w[0].count), 0);
    ASSERT_EQ(v[1].count, experts * 2 * half * h);
    ASSERT_EQ(v[2].count, experts * h * half);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < 2 * half; ++r) {
        const int64_t whole_row = r < half ? tp_rank * half + r : f + tp_rank * half + r - half;
        for (int64_t c = 0; c < h; ++c) {
          ASSERT_EQ(v[1].values[(e * 2 * half + r) * h + c],
                    w[1].values[(e * 2 * f + whole_row) * h + c]);
        }
      }
      for (int64_t r = 0; r < h; ++r) {
        for (int64_t c = 0; c < half; ++c) {
          ASSERT_EQ(v[2].values[(e * h + r) * half + c],
                    w[2].values[(e * h + r) * f + tp_rank * half + c]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dhelix::rt
