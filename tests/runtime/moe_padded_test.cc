// The CUDA MoE layer's host-side arithmetic (runtime/kernels/moe_padded.h,
// moe_capacity.h's capacity_priority): the padded rows and the regrouping against the
// worked example, and the per-assignment decisions against the CPU's sort and slots.

#include "runtime/kernels/moe_padded.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/cpu/moe_cpu.h"
#include "runtime/kernels/moe_capacity.h"

namespace dhelix::kernels {
namespace {

TEST(MoePadded, RegroupMatchesTheWorkedExample) {
  // E = 4, ep = 2 (L = 2), C = 2: source-major row 5 = (src 1, e 0, r 1) -> expert-major 3.
  EXPECT_EQ(padded_regroup_row(5, 2, 2, 2, true), 3);
  EXPECT_EQ(padded_regroup_row(3, 2, 2, 2, false), 5);
  // Every source-major row (src, e, r) by hand, and the inverse.
  const int64_t ep = 2, local = 3, capacity = 4;
  for (int64_t src = 0; src < ep; ++src) {
    for (int64_t e = 0; e < local; ++e) {
      for (int64_t r = 0; r < capacity; ++r) {
        const int64_t source_row = (src * local + e) * capacity + r;
        const int64_t expert_row = (e * ep + src) * capacity + r;
        EXPECT_EQ(padded_regroup_row(source_row, ep, local, capacity, true), expert_row);
        EXPECT_EQ(padded_regroup_row(expert_row, ep, local, capacity, false), source_row);
      }
    }
  }
  EXPECT_EQ(padded_rows(4, 2), 8);
}

TEST(MoePadded, CapacityPriorityKeepsWhatTheSortKeeps) {
  // moe_capacity.h's example: tokens 0, 1, 2 to expert 0 with 0.6, 0.7, 0.6 (k = 1), C = 2.
  const std::vector<int32_t> chosen = {0, 0, 0, 1};
  const std::vector<float> gate = {0.6f, 0.7f, 0.6f, 0.9f};
  EXPECT_EQ(capacity_priority(4, chosen.data(), gate.data(), 0), 1);
  EXPECT_EQ(capacity_priority(4, chosen.data(), gate.data(), 1), 0);
  EXPECT_EQ(capacity_priority(4, chosen.data(), gate.data(), 2), 2);  // dropped at C = 2
  EXPECT_EQ(capacity_priority(4, chosen.data(), gate.data(), 3), 0);

  // Random routings with many ties (gates from a few values): the same kept set as
  // drop_over_capacity for every capacity.
  std::mt19937 engine(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t tokens = 1 + trial % 13, k = 1 + trial % 3, experts = 4;
    const int64_t n = tokens * k;
    std::vector<int32_t> c(static_cast<size_t>(n));
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t a = 0; a < n; ++a) {
      c[static_cast<size_t>(a)] = static_cast<int32_t>(engine() % experts);
      g[static_cast<size_t>(a)] = 0.25f * static_cast<float>(engine() % 4);
    }
    for (int64_t capacity = 0; capacity <= tokens; ++capacity) {
      std::vector<uint8_t> kept(static_cast<size_t>(n));
      drop_over_capacity(tokens, k, experts, capacity, c.data(), g.data(), kept.data());
      for (int64_t a = 0; a < n; ++a) {
        const bool keep = capacity_priority(n, c.data(), g.data(), a) < capacity;
        ASSERT_EQ(keep, kept[static_cast<size_t>(a)] != 0) << "trial " << trial << " a " << a;
      }
    }
  }
}

TEST(MoePadded, PaddedRowsHoldTheCpuSlotsInOrder) {
  // The CPU's routing of a random layer with dropping: every kept assignment's padded row
  // is chosen * C + (its slot - the first slot of its expert), so the padded buffer holds
  // the CPU's permuted rows block by block.
  cpu::MoeLayerShape s{.tokens = 12,
                       .hidden = 3,
                       .experts = 4,
                       .top_k = 2,
                       .ffn = 2,
                       .capacity_factor = 1.0,
                       .aux_loss_coeff = 0.0};
  std::mt19937 engine(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(s.tokens * s.hidden));
  std::vector<float> router(static_cast<size_t>(s.experts * s.hidden));
  for (float& v : x) v = normal(engine);
  for (float& v : router) v = normal(engine);
  cpu::MoeRouting r;
  cpu::moe_route(s, x.data(), router.data(), r);
  ASSERT_EQ(r.capacity, 6);  // ceil(1 * 12 * 2 / 4)
  std::vector<int64_t> first(static_cast<size_t>(s.experts), 0);
  for (int64_t e = 1; e < s.experts; ++e) {
    first[static_cast<size_t>(e)] =
        first[static_cast<size_t>(e - 1)] + r.expert_rows[static_cast<size_t>(e - 1)];
  }
  for (int64_t a = 0; a < s.tokens * s.top_k; ++a) {
    const auto i = static_cast<size_t>(a);
    if (r.kept[i] == 0) continue;
    const int64_t e = r.chosen[i];
    EXPECT_EQ(padded_position(r.chosen.data(), r.kept.data(), a),
              r.slot_of[i] - first[static_cast<size_t>(e)]);
    EXPECT_LT(padded_position(r.chosen.data(), r.kept.data(), a), r.capacity);
  }
}

}  // namespace
}  // namespace dhelix::kernels
