// PaddedSharedExpert (runtime/model/moe_shared_expert_padded.h), the device path's shared
// expert, on host memory against the CPU's (runtime/model/moe_shared_expert_cpu.cc, bound
// through MoeLayersCpu): on PaddedCpuBackend (tests/runtime/padded_cpu_backend.h: the CPU
// backend plus runtime/cpu/moe_padded_cpu.h, whose gate steps loop over the row functions of
// runtime/kernels/moe_shared_gate.h), so that the two bindings run the same GEMMs and row
// functions and must agree bit for bit, except where d logit's dot product enters (summed
// in the GPU warp's lane-tree order on the padded path, left to right on the CPU): within
// fp32 rounding there. tp = 1, and tp = 2 with SP (both TP ranks, the all-gathers and
// reduce-scatters applied on the host for both alike): the initial weights, the MoE output
// y += g shared(x) and fc1's and fc2's weight gradients bitwise; dx and the gate's
// gradient within 1e-5 relative; the parameters' names and gradient groups; the TP
// exchanges refused with tp = 1.
#include "runtime/model/moe_shared_expert_padded.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/model/cpu_backend.h"
#include "runtime/model/moe_layers_cpu.h"
#include "runtime/model/moe_layers_padded.h"
#include "tests/runtime/padded_cpu_backend.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

static_assert(PaddedSharedExpertBackend<test::PaddedCpuBackend>);

using Shared = PaddedSharedExpert<test::PaddedCpuBackend>;

constexpr int64_t kWidth = 24;

JobSpec shared_job(int64_t tp) {
  JobSpec job = test::tiny_job(tp, /*sp=*/tp > 1);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 1.0,
                          .expert_ffn_hidden_size = 16,
                          .shared_expert_ffn_hidden_size = kWidth,
                          .aux_loss_coeff = 0.01};
  return job;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> pick(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& value : v) value = pick(engine);
  return v;
}

// Runs one op on every TP rank: compute ops as they are; a collective's local steps around
// the all-gather or reduce-scatter, which is applied on the host in rank order.
template <class Bound>
void run_on_group(std::vector<Bound>& bound) {
  const typename CpuBackend::Exec exec;
  if (bound[0].compute) {
    for (Bound& b : bound) b.compute(exec);
    return;
  }
  for (Bound& b : bound) {
    if (b.before_collective) b.before_collective(exec);
  }
  const int64_t tp = static_cast<int64_t>(bound.size());
  for (int64_t r = 0; r < tp; ++r) {
    const CollectiveRequest& to = *bound[static_cast<size_t>(r)].collective;
    const int64_t n = to.count;
    float* out = static_cast<float*>(to.out);
    for (int64_t src = 0; src < tp; ++src) {
      const CollectiveRequest& from = *bound[static_cast<size_t>(src)].collective;
      const float* in = static_cast<const float*>(from.in);
      if (to.kind == CollectiveKind::kAllGather) {
        std::copy_n(in, n, out + src * n);
      } else {
        ASSERT_EQ(to.kind, CollectiveKind::kReduceScatter);
        for (int64_t i = 0; i < n; ++i) out[i] = (src == 0 ? 0.0f : out[i]) + in[r * n + i];
      }
    }
  }
  for (Bound& b : bound) {
    if (b.after_collective) b.after_collective(exec);
  }
}

// d logit's dot product <dy, out>: the padded path sums it as the GPU's warp does
// (kernels::lane_tree_sum's order), the CPU left to right; what flows from it (dx through
// the gate, the gate's weight gradient) agrees within fp32 rounding of an h-term sum.
void expect_within_dot_rounding(const std::vector<float>& got, const std::vector<float>& want,
                                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

void expect_same_as_the_cpu(int64_t tp) {
  const JobSpec job = shared_job(tp);
  const RankShape d = rank_shape(job, 0);
  const int64_t n = d.rows, h = d.hidden;
  const float loss_scale = 1.0f;
  CpuBackend::Memory memory;
  std::vector<std::unique_ptr<MoeLayersCpu>> cpu;
  std::vector<std::unique_ptr<Shared>> padded;
  std::vector<std::vector<float>> x, dy, y_cpu, y_padded, dx_cpu;
  std::vector<MoeLayerIo> cpu_io;
  std::vector<PaddedMoeIo<float>> padded_io;
  for (int64_t r = 0; r < tp; ++r) {
    cpu.push_back(std::make_unique<MoeLayersCpu>(job, r, std::vector<int64_t>{0}, 7, &loss_scale));
    padded.push_back(std::make_unique<Shared>(job, r, std::vector<int64_t>{0}, 7, memory));
    x.push_back(random_values(static_cast<size_t>(n * h), static_cast<uint32_t>(1 + r)));
    dy.push_back(random_values(static_cast<size_t>(n * h), static_cast<uint32_t>(11 + r)));
    y_cpu.push_back(random_values(static_cast<size_t>(n * h), static_cast<uint32_t>(21 + r)));
    y_padded.push_back(y_cpu.back());  // as if the routed experts had written it
    dx_cpu.emplace_back(static_cast<size_t>(n * h), 0.0f);
  }
  for (size_t r = 0; r < static_cast<size_t>(tp); ++r) {
    cpu_io.push_back({x[r].data(), y_cpu[r].data(), dy[r].data(), dx_cpu[r].data()});
    padded_io.push_back({x[r].data(), y_padded[r].data(), dy[r].data(), nullptr});
  }
  std::vector<std::string> ops = {"fwd.shared_fc1", "fwd.shared_swiglu", "fwd.shared_fc2"};
  if (tp > 1) {
    ops = {"fwd.allgather_shared", "fwd.shared_fc1", "fwd.shared_swiglu", "fwd.shared_fc2",
           "fwd.reduce_scatter_shared"};
  }
  // The wgrad first at tp = 1, as the plan may order it (it scales dy itself).
  const std::vector<std::string> backward =
      tp > 1 ? std::vector<std::string>{"bwd.allgather_shared", "bwd.shared_fc2_dgrad",
                                        "bwd.shared_fc2_wgrad", "bwd.shared_swiglu",
                                        "bwd.shared_fc1_dgrad", "bwd.reduce_scatter_shared",
                                        "bwd.shared_fc1_wgrad"}
             : std::vector<std::string>{"bwd.shared_fc2_wgrad", "bwd.shared_fc2_dgrad",
                                        "bwd.shared_swiglu", "bwd.shared_fc1_dgrad",
                                        "bwd.shared_fc1_wgrad"};
  ops.insert(ops.end(), backward.begin(), backward.end());
  for (const std::string& op : ops) {
    SCOPED_TRACE(op);
    std::vector<BoundOp> cpu_bound;
    std::vector<Shared::BoundOp> padded_bound;
    for (size_t r = 0; r < static_cast<size_t>(tp); ++r) {
      std::optional<BoundOp> c = cpu[r]->bind(op, 0, 0, cpu_io[r]);
      std::optional<Shared::BoundOp> p = padded[r]->bind(op, 0, 0, padded_io[r], false);
      ASSERT_TRUE(c.has_value() && p.has_value());
      EXPECT_EQ(c->compute == nullptr, p->compute == nullptr);
      cpu_bound.push_back(std::move(*c));
      padded_bound.push_back(std::move(*p));
    }
    run_on_group(cpu_bound);
    run_on_group(padded_bound);
  }
  for (size_t r = 0; r < static_cast<size_t>(tp); ++r) {
    SCOPED_TRACE(::testing::Message() << "TP rank " << r);
    EXPECT_EQ(y_padded[r], y_cpu[r]);
    EXPECT_NE(y_padded[r],
              random_values(static_cast<size_t>(n * h), static_cast<uint32_t>(21 + r)));
    // The CPU's dx = (permute's + the router's, zero here) + through fc1 + through the gate.
    cpu[r]->sum_input_gradient(0, 0, cpu_io[r])(CpuBackend::Exec{});
    const auto [through_fc1, through_gate] = padded[r]->input_gradients(0, 0, false);
    std::vector<float> dx(static_cast<size_t>(n * h));
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = (0.0f + through_fc1[i]) + through_gate[i];
    expect_within_dot_rounding(dx, dx_cpu[r], "dx");
    const std::vector<ParameterView> want = cpu[r]->parameters(0);
    const std::vector<Shared::ParameterView> got = padded[r]->parameters(0);
    ASSERT_EQ(want.size(), 6u);
    ASSERT_EQ(got.size(), 3u);
    for (size_t p = 0; p < 3; ++p) {
      const ParameterView& w = want[3 + p];
      SCOPED_TRACE(w.name);
      EXPECT_EQ(got[p].name, w.name);
      EXPECT_EQ(got[p].expert, w.expert);
      EXPECT_EQ(got[p].sum_gradient_over_tp, w.sum_gradient_over_tp);
      ASSERT_EQ(got[p].count, w.count);
      EXPECT_EQ(std::vector<float>(got[p].values, got[p].values + w.count),
                std::vector<float>(w.values, w.values + w.count));
      const std::vector<float> gradient(got[p].gradient, got[p].gradient + w.count);
      const std::vector<float> want_gradient(w.gradient, w.gradient + w.count);
      if (p == 0) {  // the gate's: from d logit
        expect_within_dot_rounding(gradient, want_gradient, "gate gradient");
      } else {
        EXPECT_EQ(gradient, want_gradient);
      }
    }
    EXPECT_EQ(got[0].sum_gradient_over_tp, tp > 1);  // the replicated gate
  }
}

TEST(PaddedSharedExpert, EqualsTheCpuSharedExpertAtTp1) { expect_same_as_the_cpu(1); }

TEST(PaddedSharedExpert, EqualsTheCpuSharedExpertAtTp2) { expect_same_as_the_cpu(2); }

TEST(PaddedSharedExpert, RefusesTheTpExchangesWithTp1AndForeignOps) {
  const JobSpec job = shared_job(1);
  CpuBackend::Memory memory;
  Shared shared(job, 0, {0}, 7, memory);
  std::vector<float> buffer(static_cast<size_t>(32 * 64));
  const PaddedMoeIo<float> io{buffer.data(), buffer.data(), buffer.data(), buffer.data()};
  EXPECT_THROW(shared.bind("fwd.allgather_shared", 0, 0, io, false), Error);
  EXPECT_THROW(shared.bind("bwd.reduce_scatter_shared", 0, 0, io, false), Error);
  EXPECT_FALSE(shared.bind("fwd.router", 0, 0, io, false).has_value());
  EXPECT_TRUE(Shared::handles("bwd.shared_fc1_wgrad"));
  EXPECT_FALSE(Shared::handles("fwd.grouped_fc1"));
}

}  // namespace
}  // namespace dhelix::rt
