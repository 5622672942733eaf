// The CUDA MoE layer's host-side arithmetic (runtime/kernels/moe_padded.h,
// moe_capacity.h's capacity_priority and keeps_assignment): the padded rows and the regrouping
// against the worked example, and the per-assignment decisions against the CPU's sort and slots;
// and the CUDA kernels' host twin (runtime/cpu/moe_padded_cpu.h) against the CPU's MoE functions,
// bit for bit where both sum in the same order, within fp32 rounding where the twin sums in
// the warps' tree order (tests/runtime/moe_route_scan_test.cc checks the router's pieces).

#include "runtime/kernels/moe_padded.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "lib/error.h"
#include "runtime/cpu/moe_cpu.h"
#include "runtime/cpu/moe_padded_cpu.h"
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
      std::vector<int64_t> routed(static_cast<size_t>(experts));
      routed_counts(tokens, k, experts, c.data(), routed.data());
      for (int64_t a = 0; a < n; ++a) {
        const bool keep = capacity_priority(n, c.data(), g.data(), a) < capacity;
        ASSERT_EQ(keep, kept[static_cast<size_t>(a)] != 0) << "trial " << trial << " a " << a;
        // The shortcut for experts within their capacity decides the same.
        ASSERT_EQ(keeps_assignment(n, c.data(), g.data(), routed.data(), capacity, a), keep)
            << "trial " << trial << " a " << a;
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
  const int64_t n = s.tokens * s.top_k;
  std::vector<int64_t> row(static_cast<size_t>(n), -2);
  for (int64_t e = 0; e < s.experts; ++e) {
    EXPECT_EQ(assign_padded_rows(n, r.chosen.data(), r.kept.data(), r.capacity, e, row.data()),
              r.expert_rows[static_cast<size_t>(e)]);
  }
  for (int64_t a = 0; a < n; ++a) {
    const auto i = static_cast<size_t>(a);
    if (r.kept[i] == 0) {
      EXPECT_EQ(row[i], -1);
      continue;
    }
    const int64_t e = r.chosen[i];
    EXPECT_EQ(row[i], e * r.capacity + r.slot_of[i] - first[static_cast<size_t>(e)]);
    EXPECT_LT(row[i] - e * r.capacity, r.capacity);
  }
}

std::vector<float> random_floats(int64_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(engine);
  return values;
}

// Within `rel` of each reference value (plus rel in absolute terms near 0): the sums the
// twin computes in the CUDA warps' lane-tree or block-tree order where the CPU sums in
// element order (probabilities, aux loss, dgate, dz).
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float rel,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

// Bit for bit where both sum in the same order (the routing decisions, weights, rows,
// copies and the combine); within fp32 rounding where the twin sums as the warps do.
TEST(MoePaddedHost, TheKernelsTwinComputesTheCpuFunctions) {
  const cpu::MoeLayerShape s{.tokens = 24,
                             .hidden = 8,
                             .experts = 4,
                             .top_k = 2,
                             .ffn = 4,
                             .capacity_factor = 0.75,
                             .aux_loss_coeff = 0.01};
  const int64_t t = s.tokens, h = s.hidden, e_all = s.experts, k = s.top_k, n = t * k;
  cpu::MoeRouting cpu_routing;
  cpu_routing.logits = random_floats(t * e_all, 1);
  cpu::moe_route_logits(s, cpu_routing);
  ASSERT_GT(cpu_routing.dropped, 0) << "the case should drop assignments";
  const MoePaddedShape shape{.tokens = t,
                             .hidden = h,
                             .experts = e_all,
                             .top_k = k,
                             .capacity = cpu_routing.capacity,
                             .aux_loss_coeff = s.aux_loss_coeff};
  const int64_t rows = padded_rows(e_all, shape.capacity);
  auto sized = [](int64_t count) { return static_cast<size_t>(count); };
  std::vector<int32_t> chosen(sized(n));
  std::vector<float> gate(sized(n)), probs(sized(t * e_all)), aux(1);
  std::vector<uint8_t> kept(sized(n));
  std::vector<int64_t> row(sized(n)), routed(sized(e_all)), counts(sized(e_all));
  const MoePaddedRouting r{.chosen = chosen.data(),
                           .gate = gate.data(),
                           .probs = probs.data(),
                           .kept = kept.data(),
                           .row = row.data(),
                           .routed = routed.data(),
                           .send_counts = counts.data(),
                           .aux_loss = aux.data()};
  cpu::moe_route(shape, cpu_routing.logits.data(), r);
  EXPECT_EQ(chosen, cpu_routing.chosen);
  EXPECT_EQ(gate, cpu_routing.gate);
  expect_near_all(probs, cpu_routing.probs, 1e-6f, "probs");
  EXPECT_EQ(kept, cpu_routing.kept);
  EXPECT_EQ(routed, cpu_routing.routed);
  EXPECT_NEAR(aux[0], cpu_routing.aux_loss, 1e-6f * cpu_routing.aux_loss);
  // The CPU's slots block by block: slot - first slot of its expert = position in block.
  std::vector<int64_t> first(sized(e_all), 0);
  for (int64_t e = 1; e < e_all; ++e) {
    first[sized(e)] = first[sized(e - 1)] + cpu_routing.expert_rows[sized(e - 1)];
  }
  auto padded_of_slot = [&](int64_t slot, int64_t a) {
    const int64_t e = chosen[sized(a)];
    return slot < 0 ? -1 : e * shape.capacity + slot - first[sized(e)];
  };
  for (int64_t a = 0; a < n; ++a) {
    EXPECT_EQ(row[sized(a)], padded_of_slot(cpu_routing.slot_of[sized(a)], a)) << "a " << a;
  }
  for (int64_t e = 0; e < e_all; ++e)
    EXPECT_EQ(counts[sized(e)], cpu_routing.expert_rows[sized(e)] * h);

  // The CPU's compact rows <-> the padded ones (zero padding).
  const int64_t slots = cpu_routing.slots();
  auto padded = [&](const std::vector<float>& compact) {
    std::vector<float> out(sized(rows * h), 0.0f);
    for (int64_t a = 0; a < n; ++a) {
      const int64_t slot = cpu_routing.slot_of[sized(a)];
      if (slot < 0) continue;
      std::copy_n(compact.begin() + slot * h, h, out.begin() + padded_of_slot(slot, a) * h);
    }
    return out;
  };
  const std::vector<float> x = random_floats(t * h, 2), dy = random_floats(t * h, 3);
  std::vector<float> want(sized(slots * h)), got = random_floats(rows * h, 4);  // garbage
  cpu::moe_permute(s, cpu_routing, x.data(), want.data());
  cpu::moe_permute(shape, r, x.data(), got.data());
  EXPECT_EQ(got, padded(want)) << "permute (the padding zeroed)";

  const std::vector<float> out_compact = random_floats(slots * h, 5);
  std::vector<float> out_padded = padded(out_compact);
  for (size_t i = 0; i < out_padded.size(); ++i) {  // garbage in the padding: never read
    if (out_padded[i] == 0.0f) out_padded[i] = 1e30f;
  }
  std::vector<float> y_want(sized(t * h)), y_got(sized(t * h));
  cpu::moe_unpermute(s, cpu_routing, out_compact.data(), y_want.data());
  cpu::moe_unpermute(shape, r, out_padded.data(), y_got.data());
  EXPECT_EQ(y_got, y_want) << "unpermute";

  std::vector<float> d_want(sized(slots * h)), dgate_want(sized(n)), dgate_got(sized(n));
  std::vector<float> d_got = random_floats(rows * h, 6);
  cpu::moe_unpermute_backward(s, cpu_routing, dy.data(), out_compact.data(), d_want.data(),
                              dgate_want.data());
  cpu::moe_unpermute_backward(shape, r, dy.data(), out_padded.data(), d_got.data(),
                              dgate_got.data());
  EXPECT_EQ(d_got, padded(d_want)) << "unpermute backward";
  expect_near_all(dgate_got, dgate_want, 1e-5f, "dgate");

  std::vector<float> dx_want(sized(t * h)), dx_got(sized(t * h));
  cpu::moe_permute_backward(s, cpu_routing, out_compact.data(), dx_want.data());
  cpu::moe_permute_backward(shape, r, out_padded.data(), dx_got.data());
  EXPECT_EQ(dx_got, dx_want) << "permute backward";

  std::vector<float> dz_want(sized(t * e_all)), dz_got(sized(t * e_all));
  cpu::moe_router_logits_backward(s, cpu_routing, dgate_want.data(), 3.0f, dz_want.data());
  cpu::moe_router_logits_backward(shape, r, dgate_want.data(), 3.0f, dz_got.data());
  expect_near_all(dz_got, dz_want, 1e-6f, "router logits backward");

  // The regroup and its inverse restore every row (ep 2, 2 local experts).
  const std::vector<float> source = random_floats(rows * h, 7);
  std::vector<float> expert(source.size()), back(source.size());
  cpu::moe_regroup(2, 2, shape.capacity, h, source.data(), expert.data(), true);
  cpu::moe_regroup(2, 2, shape.capacity, h, expert.data(), back.data(), false);
  EXPECT_EQ(back, source);
  EXPECT_EQ(std::vector<float>(expert.begin() + 3 * shape.capacity * h,
                               expert.begin() + 4 * shape.capacity * h),
            std::vector<float>(source.begin() + 3 * shape.capacity * h,
                               source.begin() + 4 * shape.capacity * h))
      << "block (src 1, e 1) stays last";
}

TEST(MoePaddedHost, RefusesWhatThePaddedLayoutCannotHold) {
  auto refusal = [](MoePaddedShape shape) -> std::string {
    try {
      cpu::check_moe_shape(shape);
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
      return error.what();
    }
    return "";
  };
  const MoePaddedShape fine{.tokens = 4, .hidden = 2, .experts = 4, .top_k = 2, .capacity = 2};
  EXPECT_EQ(refusal(fine), "");
  MoePaddedShape dropless = fine;
  dropless.capacity = 0;
  EXPECT_EQ(refusal(dropless),
            "MoE with padded blocks on the host: the capacity is 0 (no expert would accept a "
            "token: a capacity factor this small rounds ceil(cf T k / E) to 0); raise "
            "moe.capacity_factor, or set 0 for dropless");
  MoePaddedShape wide = fine;
  wide.top_k = 5;
  EXPECT_EQ(refusal(wide), "MoE with padded blocks on the host: top-5 of 4 experts");
}

}  // namespace
}  // namespace dhelix::kernels
