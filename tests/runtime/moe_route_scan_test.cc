// The CUDA router's parallel decomposition (runtime/kernels/moe_route_scan.h), run by its
// host twin (runtime/cpu/moe_route_twin.cc), against the serial reference functions the
// kernels replaced (moe_router.h's router_topk_row and router_softmax_row, moe_capacity.h's
// routed_counts and load_balancing_loss, moe_padded.h's assign_padded_rows, a serial
// router_backward_row): the decisions, weights, rows and counts bit for bit; the sums the
// warps and blocks add in tree order (probabilities, aux loss, dz) within 1e-6 relative.
// Edge cases: dropping at capacity, k = 1, 2 and 8, an expert with no tokens, T k not a
// multiple of the 256-assignment tile, many tiles, tied logits, 256 experts.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/cpu/moe_padded_cpu.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/kernels/moe_route_scan.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::kernels {
namespace {

size_t sized(int64_t n) { return static_cast<size_t>(n); }

// One routing's buffers on the host.
struct HostRouting {
  std::vector<int32_t> chosen;
  std::vector<float> gate, probs, aux;
  std::vector<uint8_t> kept;
  std::vector<int64_t> row, routed, counts;
  explicit HostRouting(const MoePaddedShape& s)
      : chosen(sized(s.tokens * s.top_k)),
        gate(sized(s.tokens * s.top_k)),
        probs(sized(s.tokens * s.experts)),
        aux(1),
        kept(sized(s.tokens * s.top_k)),
        row(sized(s.tokens * s.top_k)),
        routed(sized(s.experts)),
        counts(sized(s.experts)) {}
  MoePaddedRouting view() {
    return {.chosen = chosen.data(),
            .gate = gate.data(),
            .probs = probs.data(),
            .kept = kept.data(),
            .row = row.data(),
            .routed = routed.data(),
            .send_counts = counts.data(),
            .aux_loss = aux.data()};
  }
};

// The serial reference: what kernels_moe.cu computed before, one thread per token, per
// expert (over all T k assignments) and one for the aux loss.
HostRouting serial_route(const MoePaddedShape& s, const std::vector<float>& logits) {
  HostRouting r(s);
  const int64_t n = s.tokens * s.top_k;
  for (int64_t t = 0; t < s.tokens; ++t) {
    router_topk_row(s.experts, s.top_k, logits.data() + t * s.experts,
                    r.chosen.data() + t * s.top_k, r.gate.data() + t * s.top_k);
    router_softmax_row(s.experts, logits.data() + t * s.experts, r.probs.data() + t * s.experts);
  }
  routed_counts(s.tokens, s.top_k, s.experts, r.chosen.data(), r.routed.data());
  for (int64_t a = 0; a < n; ++a) {
    r.kept[sized(a)] =
        keeps_assignment(n, r.chosen.data(), r.gate.data(), r.routed.data(), s.capacity, a);
  }
  for (int64_t e = 0; e < s.experts; ++e) {
    r.counts[sized(e)] =
        assign_padded_rows(n, r.chosen.data(), r.kept.data(), s.capacity, e, r.row.data()) *
        s.hidden;
  }
  r.aux[0] = load_balancing_loss(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, r.probs.data(),
                                 r.routed.data());
  return r;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float rel,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

struct Case {
  int64_t tokens, experts, top_k;
  double cf;
  int64_t idle_expert;  // an expert no token picks (-1: none)
  int levels;           // 0: normal logits; else logits from `levels` values (ties)
};

std::vector<float> case_logits(const Case& c, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> z(sized(c.tokens * c.experts));
  for (float& v : z) {
    v = c.levels == 0 ? normal(engine) : static_cast<float>(engine() % c.levels) * 0.5f;
  }
  if (c.idle_expert >= 0) {
    for (int64_t t = 0; t < c.tokens; ++t) z[sized(t * c.experts + c.idle_expert)] = -30.0f;
  }
  return z;
}

MoePaddedShape shape_of(const Case& c) {
  const int64_t capacity =
      c.cf > 0 ? expert_capacity(c.tokens, c.top_k, c.experts, c.cf) : c.tokens;
  return {.tokens = c.tokens,
          .hidden = 16,
          .experts = c.experts,
          .top_k = c.top_k,
          .capacity = capacity,
          .aux_loss_coeff = 0.01};
}

const Case kCases[] = {
    {24, 4, 2, 0.75, -1, 0},    // the GPU test's layer: drops
    {300, 8, 2, 1.0, 5, 0},     // an idle expert; T k = 600, not a multiple of the tile
    {1000, 64, 1, 1.25, 3, 0},  // 4 tiles, k = 1
    {517, 16, 2, 1.0, -1, 3},   // ties everywhere: the lower index wins, and drops by index
    {40, 256, 8, 0.0, 200, 0},  // 256 experts, k = 8, dropless (C = T)
};

TEST(MoeRouteScan, TheTwinRoutesAsTheSerialReference) {
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << c.tokens << " E " << c.experts << " k " << c.top_k << " cf " << c.cf);
    const MoePaddedShape s = shape_of(c);
    const std::vector<float> logits = case_logits(c, seed++);
    const HostRouting want = serial_route(s, logits);
    HostRouting got(s);
    cpu::moe_route(s, logits.data(), got.view());
    EXPECT_EQ(got.chosen, want.chosen);
    EXPECT_EQ(got.gate, want.gate);
    EXPECT_EQ(got.routed, want.routed);
    EXPECT_EQ(got.kept, want.kept);
    EXPECT_EQ(got.row, want.row);
    EXPECT_EQ(got.counts, want.counts);
    expect_near_all(got.probs, want.probs, 1e-6f, "probs");
    EXPECT_NEAR(got.aux[0], want.aux[0], 1e-6f * want.aux[0]);
    if (c.idle_expert >= 0) {
      EXPECT_EQ(got.routed[sized(c.idle_expert)], 0);
    }
  }
}

TEST(MoeRouteScan, TheCasesCoverDroppingAndSeveralTiles) {
  // Guards the edge cases above: the first and the tied case drop, the third spans tiles.
  for (int i : {0, 3}) {
    const MoePaddedShape s = shape_of(kCases[i]);
    const HostRouting r = serial_route(s, case_logits(kCases[i], static_cast<uint32_t>(i + 1)));
    int64_t dropped = 0;
    for (uint8_t k : r.kept) dropped += k == 0 ? 1 : 0;
    EXPECT_GT(dropped, 0) << "case " << i;
  }
  EXPECT_EQ(moe_scan_tiles(1000), 4);
  EXPECT_EQ(moe_scan_tiles(600), 3);
}

TEST(MoeRouteScan, PositionsFollowTheTokenOrderAcrossTiles) {
  // 600 tokens, top-1, token t to expert t % 3 (a one-hot logit), dropless: expert e's
  // tokens e, e + 3, ... take its rows in order, across the tiles [0, 256), [256, 512), ...
  const MoePaddedShape s{
      .tokens = 600, .hidden = 2, .experts = 3, .top_k = 1, .capacity = 600, .aux_loss_coeff = 0};
  std::vector<float> logits(600 * 3, 0.0f);
  for (int64_t t = 0; t < 600; ++t) logits[sized(t * 3 + t % 3)] = 1.0f;
  HostRouting r(s);
  cpu::moe_route(s, logits.data(), r.view());
  for (int64_t t = 0; t < 600; ++t) {
    ASSERT_EQ(r.row[sized(t)], (t % 3) * 600 + t / 3) << "token " << t;
  }
  EXPECT_EQ(r.counts, (std::vector<int64_t>{400, 400, 400}));  // 200 rows x h 2
}

TEST(MoeRouteScan, TheScratchLayoutHoldsCountsThenAlignedPartials) {
  // T 300, k 2: 3 tiles; E 5: 15 int32 counts = 60 bytes, partials from 64; T E = 1500
  // terms: one aux block of 2048.
  const MoeRouteScratch s = moe_route_scratch(300, 2, 5);
  EXPECT_EQ(s.tiles, 3);
  EXPECT_EQ(s.aux_blocks, 1);
  EXPECT_EQ(s.aux_offset_bytes, 64);
  EXPECT_EQ(s.bytes, 64 + 8);
  EXPECT_EQ(moe_aux_blocks(4096, 64), 128);  // 262144 terms / 2048
}

TEST(MoeRouteScan, TheAuxTreeAddsPairsByHalving) {
  // Serially 1e16 + 1 - 1e16 + 1 = 1 (the first 1 is lost); the tree adds (1e16 - 1e16) and
  // (1 + 1) first: 2. The kernels' shared-memory reduction adds the same pairs.
  std::vector<double> values{1e16, 1.0, -1e16, 1.0};
  EXPECT_EQ(tree_sum_pow2(values.data(), 4), 2.0);
  // L_aux by hand: T 2, k 1, E 2, alpha 0.01; p = [[0.75 0.25] [0.5 0.5]], n = [1 1]:
  // 0.01 * 2 / 4 * (0.75 + 0.25 + 0.5 + 0.5) = 0.01.
  const std::vector<float> p{0.75f, 0.25f, 0.5f, 0.5f};
  const std::vector<int64_t> n{1, 1};
  double sum = 0.0;
  for (int64_t item = 0; item < 4; ++item) sum += moe_aux_term(item, 2, p.data(), n.data());
  EXPECT_EQ(sum, 2.0);
  EXPECT_FLOAT_EQ(moe_aux_loss_of_sum(2, 1, 2, 0.01, sum), 0.01f);
  EXPECT_EQ(moe_aux_thread_partial(0, 1, 4, 2, p.data(), n.data()), 0.25);  // item 1 only
}

TEST(MoeRouteScan, TheWarpBackwardMatchesTheSerialRow) {
  const Case c{300, 8, 2, 1.0, 5, 0};
  const MoePaddedShape s = shape_of(c);
  const std::vector<float> logits = case_logits(c, 11);
  HostRouting r(s);
  cpu::moe_route(s, logits.data(), r.view());
  std::mt19937 engine(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dgate(sized(s.tokens * s.top_k));
  for (float& v : dgate) v = normal(engine);
  for (float aux_dloss : {0.0f, 3.0f}) {
    std::vector<float> want(sized(s.tokens * s.experts)), got(want.size()), dp(sized(s.experts));
    load_balancing_gradient(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, r.routed.data(),
                            aux_dloss, dp.data());
    for (int64_t t = 0; t < s.tokens; ++t) {
      router_backward_row(s.experts, s.top_k, r.chosen.data() + t * s.top_k,
                          r.gate.data() + t * s.top_k, dgate.data() + t * s.top_k,
                          r.probs.data() + t * s.experts, aux_dloss != 0.0f ? dp.data() : nullptr,
                          want.data() + t * s.experts);
    }
    cpu::moe_router_logits_backward(s, r.view(), dgate.data(), aux_dloss, got.data());
    if (aux_dloss == 0.0f) {
      EXPECT_EQ(got, want) << "without the aux loss nothing is summed in another order";
    } else {
      expect_near_all(got, want, 1e-6f, "dz");
    }
  }
  // dp_e one at a time: load_balancing_gradient's bits.
  std::vector<float> dp(sized(s.experts));
  load_balancing_gradient(s.tokens, s.top_k, s.experts, 0.01, r.routed.data(), 3.0f, dp.data());
  for (int64_t e = 0; e < s.experts; ++e) {
    EXPECT_EQ(
        load_balancing_gradient_at(s.tokens, s.top_k, s.experts, 0.01, r.routed[sized(e)], 3.0f),
        dp[sized(e)]);
  }
}

}  // namespace
}  // namespace dhelix::kernels
