// The CPU MoE layer (runtime/cpu/moe_cpu.h) and its kernels (runtime/kernels/moe_*.h):
// gradients against finite differences with and without token dropping, the capacity
// formula, dropping by gate weight, and the load-balancing loss's value.

#include "runtime/cpu/moe_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::cpu {
namespace {

std::vector<float> random_values(size_t count, float scale, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(engine);
  return v;
}

// One MoE layer on one rank (all experts local) and the scalar it is checked with:
// L = sum_t <c_t, y_t> + L_aux.
struct MoeLayer {
  MoeLayerShape s;
  std::vector<float> x, router, fc1, fc2, c;

  explicit MoeLayer(MoeLayerShape shape) : s(shape) {
    const auto h = static_cast<size_t>(s.hidden), f = static_cast<size_t>(s.ffn);
    const auto e = static_cast<size_t>(s.experts), t = static_cast<size_t>(s.tokens);
    x = random_values(t * h, 1.0f, 1);
    router = random_values(e * h, 0.5f, 2);
    fc1 = random_values(e * 2 * f * h, 0.4f, 3);
    fc2 = random_values(e * h * f, 0.4f, 4);
    c = random_values(t * h, 1.0f, 5);
  }

  double loss(MoeRouting* keep = nullptr) const {
    MoeRouting r;
    moe_route(s, x.data(), router.data(), r);
    const auto slots = static_cast<size_t>(r.slots());
    const auto h = static_cast<size_t>(s.hidden), f = static_cast<size_t>(s.ffn);
    std::vector<float> permuted(slots * h), fc1_out(slots * 2 * f), act(slots * f), out(slots * h),
        y(x.size());
    moe_permute(s, r, x.data(), permuted.data());
    moe_experts_forward(s, r.expert_rows, permuted.data(), fc1.data(), fc2.data(), fc1_out.data(),
                        act.data(), out.data());
    moe_unpermute(s, r, out.data(), y.data());
    double sum = r.aux_loss;
    for (size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(c[i]) * y[i];
    if (keep != nullptr) *keep = r;
    return sum;
  }

  struct Gradients {
    std::vector<float> x, router, fc1, fc2;
  };

  Gradients gradients() const {
    MoeRouting r;
    moe_route(s, x.data(), router.data(), r);
    const auto slots = static_cast<size_t>(r.slots());
    const auto h = static_cast<size_t>(s.hidden), f = static_cast<size_t>(s.ffn);
    std::vector<float> permuted(slots * h), fc1_out(slots * 2 * f), act(slots * f), out(slots * h);
    moe_permute(s, r, x.data(), permuted.data());
    moe_experts_forward(s, r.expert_rows, permuted.data(), fc1.data(), fc2.data(), fc1_out.data(),
                        act.data(), out.data());
    Gradients g{std::vector<float>(x.size()), std::vector<float>(router.size()),
                std::vector<float>(fc1.size()), std::vector<float>(fc2.size())};
    std::vector<float> d_out(slots * h), dgate(static_cast<size_t>(s.tokens * s.top_k)),
        d_permuted(slots * h);
    moe_unpermute_backward(s, r, c.data(), out.data(), d_out.data(), dgate.data());
    moe_experts_backward(s, r.expert_rows, permuted.data(), fc1.data(), fc2.data(), fc1_out.data(),
                         act.data(), d_out.data(), d_permuted.data(), g.fc1.data(), g.fc2.data());
    moe_permute_backward(s, r, d_permuted.data(), g.x.data());
    moe_router_backward(s, r, x.data(), router.data(), dgate.data(), 1.0f, g.x.data(),
                        g.router.data());
    return g;
  }
};

// Central differences on every element of every tensor; the routing must not change under
// the step (checked), so the loss is smooth there.
void expect_gradients_match(MoeLayer layer) {
  MoeRouting reference;
  layer.loss(&reference);
  const MoeLayer::Gradients g = layer.gradients();
  const std::vector<
      std::pair<std::string, std::pair<std::vector<float>*, const std::vector<float>*>>>
      tensors = {{"x", {&layer.x, &g.x}},
                 {"router", {&layer.router, &g.router}},
                 {"fc1", {&layer.fc1, &g.fc1}},
                 {"fc2", {&layer.fc2, &g.fc2}}};
  int64_t checked = 0;
  for (const auto& [name, pair] : tensors) {
    auto& [values, grads] = pair;
    for (size_t i = 0; i < values->size(); ++i) {
      const float original = (*values)[i];
      const float step = 1e-2f;
      MoeRouting plus_routing, minus_routing;
      (*values)[i] = original + step;
      const double plus = layer.loss(&plus_routing);
      (*values)[i] = original - step;
      const double minus = layer.loss(&minus_routing);
      (*values)[i] = original;
      auto same = [&](const MoeRouting& other) {
        return other.chosen == reference.chosen && other.slot_of == reference.slot_of;
      };
      if (!same(plus_routing) || !same(minus_routing)) {
        continue;  // the step flipped a top-k choice or a drop: not differentiable there
      }
      const double numeric = (plus - minus) / (2.0 * step);
      EXPECT_NEAR((*grads)[i], numeric, 1e-2 + 1e-2 * std::abs(numeric))
          << name << " element " << i;
      ++checked;
    }
  }
  const size_t all = layer.x.size() + layer.router.size() + layer.fc1.size() + layer.fc2.size();
  EXPECT_GT(checked, static_cast<int64_t>(all * 9 / 10));  // flips are rare
}

MoeLayerShape small_shape(double capacity_factor) {
  return {.tokens = 12,
          .hidden = 8,
          .experts = 4,
          .top_k = 2,
          .ffn = 6,
          .capacity_factor = capacity_factor,
          .aux_loss_coeff = 0.5};  // large, so that the aux loss's gradient shows
}

TEST(MoeLayerTest, GradientsMatchFiniteDifferencesWithoutDropping) {
  MoeLayer layer(small_shape(0.0));
  MoeRouting r;
  layer.loss(&r);
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.slots(), 12 * 2);
  expect_gradients_match(layer);
}

TEST(MoeLayerTest, GradientsMatchFiniteDifferencesWithDropping) {
  MoeLayer layer(small_shape(0.75));  // C = ceil(0.75 * 12 * 2 / 4) = 5 of the mean 6
  MoeRouting r;
  layer.loss(&r);
  EXPECT_EQ(r.capacity, 5);
  EXPECT_GT(r.dropped, 0);
  EXPECT_EQ(r.slots() + r.dropped, 12 * 2);
  for (int64_t n : r.expert_rows) EXPECT_LE(n, 5);
  expect_gradients_match(layer);
}

TEST(MoeLayerTest, CapacityFollowsTheFormula) {
  EXPECT_EQ(kernels::expert_capacity(4, 2, 4, 1.0), 2);
  EXPECT_EQ(kernels::expert_capacity(10, 2, 4, 1.25), 7);  // ceil(6.25)
  EXPECT_EQ(kernels::expert_capacity(8, 2, 4, 1.0), 4);    // exact: no rounding up
  EXPECT_EQ(kernels::expert_capacity(10, 2, 4, 0.0), 10);  // no limit
  EXPECT_EQ(kernels::expert_capacity(10, 2, 4, 100.0), 10);
}

// The worked example of moe_capacity.h: expert 0 keeps its two heaviest assignments, the
// tie going to the lower token.
TEST(MoeLayerTest, DroppingKeepsTheHeaviestAssignmentsPerExpert) {
  const std::vector<int32_t> chosen = {0, 1, 0, 2, 0, 3, 1, 2};
  const std::vector<float> gate = {0.6f, 0.4f, 0.7f, 0.3f, 0.6f, 0.4f, 0.5f, 0.5f};
  std::vector<uint8_t> kept(8);
  EXPECT_EQ(kernels::drop_over_capacity(4, 2, 4, 2, chosen.data(), gate.data(), kept.data()), 1);
  EXPECT_EQ(kept, (std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 1}));
}

// A dropped assignment contributes nothing to its token's output: the token keeps only its
// other expert's share, not renormalised.
TEST(MoeLayerTest, ADroppedTokenKeepsOnlyItsOtherExpert) {
  MoeLayerShape s = small_shape(0.75);
  MoeLayer layer(s);
  MoeRouting r;
  layer.loss(&r);
  int64_t dropped_token = -1;
  for (int64_t a = 0; a < s.tokens * s.top_k && dropped_token < 0; ++a) {
    if (r.kept[static_cast<size_t>(a)] == 0) dropped_token = a / s.top_k;
  }
  ASSERT_GE(dropped_token, 0);
  // The same tokens without a capacity limit: the dropped token's output changes, and
  // equals the kept experts' weighted outputs alone.
  MoeLayer unlimited(small_shape(0.0));
  MoeRouting all;
  unlimited.loss(&all);
  const auto slots = static_cast<size_t>(all.slots());
  const auto h = static_cast<size_t>(s.hidden), f = static_cast<size_t>(s.ffn);
  std::vector<float> permuted(slots * h), fc1_out(slots * 2 * f), act(slots * f), out(slots * h);
  moe_permute(unlimited.s, all, unlimited.x.data(), permuted.data());
  moe_experts_forward(unlimited.s, all.expert_rows, permuted.data(), unlimited.fc1.data(),
                      unlimited.fc2.data(), fc1_out.data(), act.data(), out.data());
  std::vector<float> expected(h, 0.0f);
  for (int64_t j = 0; j < s.top_k; ++j) {
    const auto a = static_cast<size_t>(dropped_token * s.top_k + j);
    if (r.kept[a] == 0) continue;
    for (size_t i = 0; i < h; ++i) {
      expected[i] += all.gate[a] * out[static_cast<size_t>(all.slot_of[a]) * h + i];
    }
  }
  // y of the capped layer for that token.
  const auto capped_slots = static_cast<size_t>(r.slots());
  std::vector<float> p2(capped_slots * h), f2(capped_slots * 2 * f), a2(capped_slots * f),
      o2(capped_slots * h), y(layer.x.size());
  moe_permute(s, r, layer.x.data(), p2.data());
  moe_experts_forward(s, r.expert_rows, p2.data(), layer.fc1.data(), layer.fc2.data(), f2.data(),
                      a2.data(), o2.data());
  moe_unpermute(s, r, o2.data(), y.data());
  for (size_t i = 0; i < h; ++i) {
    EXPECT_FLOAT_EQ(y[static_cast<size_t>(dropped_token) * h + i], expected[i]) << i;
  }
}

// Perfectly balanced routing (uniform probabilities, equal counts) gives L_aux = alpha.
TEST(MoeLayerTest, BalancedRoutingHasAuxLossAlpha) {
  const int64_t tokens = 8, k = 2, experts = 4;
  const std::vector<float> p(static_cast<size_t>(tokens * experts), 0.25f);
  const std::vector<int64_t> counts(4, tokens * k / experts);
  EXPECT_FLOAT_EQ(kernels::load_balancing_loss(tokens, k, experts, 0.01, p.data(), counts.data()),
                  0.01f);
  // Everything on one expert with probability 1: L_aux = alpha * E / (T^2 k) * (T k) * T
  // = alpha * E, the largest value.
  std::vector<float> skewed(static_cast<size_t>(tokens * experts), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) skewed[static_cast<size_t>(t * experts)] = 1.0f;
  const std::vector<int64_t> one = {tokens * k, 0, 0, 0};
  EXPECT_FLOAT_EQ(kernels::load_balancing_loss(tokens, k, experts, 0.01, skewed.data(), one.data()),
                  0.04f);
}

TEST(MoeLayerTest, TopKBreaksTiesByLowerIndexAndNormalisesTheChosen) {
  const std::vector<float> z = {1.0f, 3.0f, 1.0f, 3.0f};
  int32_t chosen[3];
  float gate[3];
  kernels::router_topk_row(4, 3, z.data(), chosen, gate);
  EXPECT_EQ(chosen[0], 1);
  EXPECT_EQ(chosen[1], 3);
  EXPECT_EQ(chosen[2], 0);
  EXPECT_FLOAT_EQ(gate[0], gate[1]);
  EXPECT_NEAR(gate[0] + gate[1] + gate[2], 1.0f, 1e-6f);
  EXPECT_NEAR(gate[2] / gate[0], std::exp(-2.0f), 1e-6f);
}

}  // namespace
}  // namespace dhelix::cpu
