// runtime/model/moe_layers_cpu.h without EP: the plan's MoE ops, bound and run one by one
// in the DAG's order, compute exactly (bit for bit) what the tested MoE functions of
// runtime/cpu/moe_cpu.h compute in one call, forward and backward, with token copies
// dropped at capacity. EP 2 against EP 1 is tests/e2e/run_test.sh (the same losses).

#include "runtime/model/moe_layers_cpu.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dhelix::rt
