// The cuDNN attention graph as data (runtime/cuda/sdpa_graph.h): every bound tensor
// addresses dhelix's own buffers element for element, the nodes form a well-typed graph in
// a valid order (each virtual tensor made once, before use; matmul, reduction and pointwise
// shapes consistent), and the causal mask, scale, GQA sums and the deterministic variant
// are the ones the header describes.
#include "runtime/cuda/sdpa_graph.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace dhelix::cuda {
namespace {

using kernels::AttentionShape;

const AttentionShape kExample{1, 4, 2, 1, 8};  // the header's example
const AttentionShape kGqa{2, 5, 4, 2, 6};
const AttentionShape kMha{1, 3, 2, 2, 4};

int64_t offset(const SdpaTensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

TEST(SdpaGraph, HeaderExampleLayouts) {
  const SdpaGraph g = sdpa_forward_graph(kExample, 91900);
  EXPECT_EQ(g.tensor(kSdpaQ).strides, (std::array<int64_t, 4>{64, 8, 16, 1}));
  EXPECT_EQ(g.tensor(kSdpaK).dims, (std::array<int64_t, 4>{1, 1, 8, 4}));
  EXPECT_EQ(g.tensor(kSdpaK).strides, (std::array<int64_t, 4>{32, 8, 1, 8}));
  EXPECT_EQ(g.tensor(kSdpaStats).strides, (std::array<int64_t, 4>{8, 4, 1, 1}));
  EXPECT_EQ(g.bound_uids, (std::vector<int64_t>{kSdpaQ, kSdpaK, kSdpaV, kSdpaO, kSdpaStats}));
}

// Element (b, h, s, d) of each cuDNN tensor is dhelix's element at the layouts of
// runtime/kernels/attention.h.
void expect_dhelix_layouts(const SdpaGraph& g, const AttentionShape& a, bool backward) {
  const int64_t group = a.heads / a.kv_heads;
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t s = 0; s < a.seq; ++s) {
      for (int64_t h = 0; h < a.heads; ++h) {
        for (int64_t d = 0; d < a.head_dim; ++d) {
          const int64_t q_index = ((b * a.seq + s) * a.heads + h) * a.head_dim + d;
          for (int64_t uid : {kSdpaQ, kSdpaO}) {
            EXPECT_EQ(offset(g.tensor(uid), b, h, s, d), q_index);
          }
          if (backward) {
            for (int64_t uid : {kSdpaDO, kSdpaDQ}) {
              EXPECT_EQ(offset(g.tensor(uid), b, h, s, d), q_index);
            }
          }
          if (h % group != 0) continue;
          const int64_t g_head = h / group;
          const int64_t kv_index = ((b * a.seq + s) * a.kv_heads + g_head) * a.head_dim + d;
          EXPECT_EQ(offset(g.tensor(kSdpaK), b, g_head, d, s), kv_index);  // K^T
          if (backward) {
            EXPECT_EQ(offset(g.tensor(kSdpaV), b, g_head, d, s), kv_index);  // V^T
            EXPECT_EQ(offset(g.tensor(kSdpaDK), b, g_head, s, d), kv_index);
            EXPECT_EQ(offset(g.tensor(kSdpaDV), b, g_head, s, d), kv_index);
          } else {
            EXPECT_EQ(offset(g.tensor(kSdpaV), b, g_head, s, d), kv_index);
          }
        }
        const int64_t row = (b * a.heads + h) * a.seq + s;  // lse and delta [b, h, s]
        EXPECT_EQ(offset(g.tensor(kSdpaStats), b, h, s, 0), row);
        if (backward) {
          EXPECT_EQ(offset(g.tensor(kSdpaSoftmaxSum), b, h, s, 0), row);
        }
      }
    }
  }
}

TEST(SdpaGraph, BoundTensorsAreDhelixBuffersInPlace) {
  for (const AttentionShape& a : {kExample, kGqa, kMha}) {
    expect_dhelix_layouts(sdpa_forward_graph(a, 91900), a, false);
    expect_dhelix_layouts(sdpa_backward_graph(a, 91900, false), a, true);
  }
}

int64_t elements(const SdpaTensor& t) { return t.dims[0] * t.dims[1] * t.dims[2] * t.dims[3]; }

// Shapes of each node consistent; every virtual tensor made by exactly one node before any
// node reads it; every bound output made by one node.
void expect_well_formed(const SdpaGraph& g) {
  std::set<int64_t> made;
  std::map<int64_t, const SdpaTensor*> by_uid;
  for (const SdpaTensor& t : g.tensors) {
    EXPECT_TRUE(by_uid.emplace(t.uid, &t).second) << "duplicate uid " << t.uid;
  }
  auto available = [&](int64_t uid) {
    const SdpaTensor& t = *by_uid.at(uid);
    return !t.is_virtual || made.contains(uid);
  };
  for (const SdpaOp& op : g.ops) {
    SCOPED_TRACE(op.name);
    ASSERT_TRUE(by_uid.contains(op.x) && by_uid.contains(op.y));
    EXPECT_TRUE(available(op.x));
    if (op.b != 0) {
      EXPECT_TRUE(available(op.b));
    }
    if (op.t != 0) {
      EXPECT_TRUE(available(op.t));
    }
    EXPECT_TRUE(made.insert(op.y).second) << "made twice";
    EXPECT_FALSE(by_uid.at(op.y)->by_value);
    const SdpaTensor& x = *by_uid.at(op.x);
    const SdpaTensor& y = *by_uid.at(op.y);
    switch (op.kind) {
      case SdpaOpKind::kMatmul: {
        const SdpaTensor& b = *by_uid.at(op.b);
        EXPECT_EQ(x.dims[0], y.dims[0]);
        EXPECT_EQ(x.dims[1], y.dims[1]);
        EXPECT_EQ(y.dims[1] % b.dims[1], 0);  // B may have fewer (kv) heads
        EXPECT_EQ(x.dims[3], b.dims[2]);      // k
        EXPECT_EQ(x.dims[2], y.dims[2]);      // m
        EXPECT_EQ(b.dims[3], y.dims[3]);      // n
        break;
      }
      case SdpaOpKind::kReduction:
        for (int i = 0; i < 4; ++i) {
          EXPECT_TRUE(y.dims[i] == x.dims[i] || y.dims[i] == 1 || x.dims[i] % y.dims[i] == 0);
        }
        EXPECT_LT(elements(y), elements(x));
        break;
      case SdpaOpKind::kReshape:
        EXPECT_EQ(elements(x), elements(y));
        break;
      case SdpaOpKind::kPointwise:
        for (int64_t in : {op.x, op.b, op.t}) {
          if (in == 0) continue;
          const SdpaTensor& t = *by_uid.at(in);
          for (int i = 0; i < 4; ++i) EXPECT_TRUE(t.dims[i] == y.dims[i] || t.dims[i] == 1);
        }
        break;
    }
  }
  for (const SdpaTensor& t : g.tensors) {
    if (t.is_virtual) {
      EXPECT_TRUE(made.contains(t.uid)) << "virtual " << t.uid << " never made";
    }
  }
}

TEST(SdpaGraph, EveryVariantIsWellFormed) {
  for (const AttentionShape& a : {kExample, kGqa, kMha}) {
    for (const SdpaGraphForm form : kSdpaGraphForms) {
      expect_well_formed(sdpa_forward_graph(a, 91900, form));
      expect_well_formed(sdpa_backward_graph(a, 91900, false, form));
      expect_well_formed(sdpa_backward_graph(a, 91900, true, form));
    }
  }
}

std::vector<std::string> names(const SdpaGraph& g) {
  std::vector<std::string> out;
  for (const SdpaOp& op : g.ops) out.push_back(op.name);
  return out;
}

const SdpaOp& op_named(const SdpaGraph& g, const std::string& name) {
  for (const SdpaOp& op : g.ops) {
    if (op.name == name) return op;
  }
  ADD_FAILURE() << "no node " << name;
  return g.ops.front();
}

TEST(SdpaGraph, ForwardIsScaleCausalMaskSoftmaxWithStats) {
  const SdpaGraph g = sdpa_forward_graph(kExample, 91900);
  EXPECT_EQ(names(g),
            (std::vector<std::string>{"bmm1_q_kt", "attn_scale", "gen_row_index", "gen_col_index",
                                      "row_ge_col", "causal_select", "row_max", "sub_max", "exp",
                                      "row_sum", "log_sum", "stats", "softmax", "bmm2_p_v"}));
  EXPECT_FLOAT_EQ(g.tensor(op_named(g, "attn_scale").b).value, 1.0f / std::sqrt(8.0f));
  const SdpaOp& row = op_named(g, "gen_row_index");
  const SdpaOp& col = op_named(g, "gen_col_index");
  EXPECT_EQ(row.axis, 2);  // queries
  EXPECT_EQ(col.axis, 3);  // keys
  const SdpaOp& keep = op_named(g, "row_ge_col");
  EXPECT_EQ(keep.mode, SdpaMode::kCmpGe);
  EXPECT_EQ(keep.x, row.y);
  EXPECT_EQ(keep.b, col.y);
  EXPECT_EQ(g.tensor(keep.y).dtype, SdpaDtype::kBoolean);
  const SdpaOp& select = op_named(g, "causal_select");
  EXPECT_EQ(select.t, keep.y);
  EXPECT_EQ(select.x, op_named(g, "attn_scale").y);  // the scaled score is kept where row >= col
  EXPECT_EQ(g.tensor(select.b).value, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(op_named(g, "stats").y, kSdpaStats);
  EXPECT_EQ(g.tensor(op_named(g, "softmax").y).dtype, SdpaDtype::kBFloat16);
  EXPECT_EQ(op_named(g, "bmm2_p_v").y, kSdpaO);
  // Before cuDNN 9.10 the mask is the lowest float (the frontend's rule).
  const SdpaGraph old = sdpa_forward_graph(kExample, 90800);
  EXPECT_EQ(old.tensor(op_named(old, "causal_select").b).value,
            std::numeric_limits<float>::lowest());
}

TEST(SdpaGraph, BackwardMasksAfterSubtractingTheStatistics) {
  const SdpaGraph g = sdpa_backward_graph(kGqa, 91900, true);
  const SdpaOp& select = op_named(g, "causal_select");
  EXPECT_EQ(select.x, op_named(g, "sub_s_stats").y);
  EXPECT_EQ(op_named(g, "sub_s_stats").b, kSdpaStats);
  EXPECT_EQ(op_named(g, "exp_s").x, select.y);
  EXPECT_EQ(op_named(g, "softmax_sum").y, kSdpaSoftmaxSum);
  EXPECT_EQ(op_named(g, "sub_dp_sum").b, kSdpaSoftmaxSum);
}

// The legacy form (cudnn-frontend 1.7 and before, sdpa_graph.h's table): int32 index math,
// the backward's mask before the statistics, the dQ accumulator reordered F16x16; the same
// bound tensors and the same forward node order as the current form.
TEST(SdpaGraph, LegacyFormIsTheOlderFrontendPattern) {
  const SdpaGraph current = sdpa_backward_graph(kGqa, 91900, false, SdpaGraphForm::kCurrent);
  const SdpaGraph legacy = sdpa_backward_graph(kGqa, 91900, false, SdpaGraphForm::kLegacy);
  EXPECT_EQ(legacy.bound_uids, current.bound_uids);
  for (const SdpaGraph* g : {&current, &legacy}) {
    const bool old = g == &legacy;
    for (const char* index : {"gen_row_index", "gen_col_index"}) {
      EXPECT_EQ(op_named(*g, index).compute, old ? SdpaDtype::kInt32 : SdpaDtype::kFloat32);
      EXPECT_EQ(g->tensor(op_named(*g, index).y).dtype, SdpaDtype::kInt32);
    }
    EXPECT_EQ(g->tensor(kSdpaDQAccum).reorder_f16x16, old);
  }
  const SdpaOp& select = op_named(legacy, "causal_select");
  EXPECT_EQ(select.x, op_named(legacy, "mul_s_scale").y);
  EXPECT_EQ(op_named(legacy, "sub_s_stats").x, select.y);
  EXPECT_EQ(op_named(legacy, "sub_s_stats").b, kSdpaStats);
  EXPECT_EQ(op_named(legacy, "exp_s").x, op_named(legacy, "sub_s_stats").y);
  EXPECT_EQ(names(sdpa_forward_graph(kGqa, 91900, SdpaGraphForm::kLegacy)),
            names(sdpa_forward_graph(kGqa, 91900, SdpaGraphForm::kCurrent)));
}

TEST(SdpaGraph, GroupedHeadsSumTheirKeyAndValueGradients) {
  const SdpaGraph gqa = sdpa_backward_graph(kGqa, 91900, true);
  int64_t sums = 0;
  for (const SdpaOp& op : gqa.ops) {
    if (op.name != "sum_over_group") continue;
    ++sums;
    EXPECT_EQ(op.kind, SdpaOpKind::kReduction);
    EXPECT_EQ(gqa.tensor(op.x).dims[1], kGqa.heads);
    EXPECT_TRUE(op.y == kSdpaDK || op.y == kSdpaDV);
  }
  EXPECT_EQ(sums, 2);
  const SdpaGraph mha = sdpa_backward_graph(kMha, 91900, true);
  EXPECT_EQ(op_named(mha, "matmul_pt_do").y, kSdpaDV);
  EXPECT_EQ(op_named(mha, "matmul_dst_q").y, kSdpaDK);
}

TEST(SdpaGraph, DeterministicBackwardHasNoDqAccumulator) {
  const SdpaGraph det = sdpa_backward_graph(kGqa, 91900, true);
  EXPECT_EQ(det.dq_accum_bytes, 0);
  EXPECT_EQ(op_named(det, "matmul_ds_k").y, kSdpaDQ);
  for (int64_t uid : det.bound_uids) EXPECT_NE(uid, kSdpaDQAccum);

  const SdpaGraph fast = sdpa_backward_graph(kGqa, 91900, false);
  EXPECT_EQ(fast.dq_accum_bytes, 2 * 4 * 5 * 6 * 4);
  EXPECT_EQ(op_named(fast, "matmul_ds_k").y, kSdpaDQAccum);
  EXPECT_EQ(fast.tensor(kSdpaDQAccum).dtype, SdpaDtype::kFloat32);
  EXPECT_EQ(op_named(fast, "dq_from_accum").mode, SdpaMode::kIdentity);
  EXPECT_EQ(op_named(fast, "dq_from_accum").y, kSdpaDQ);
}

}  // namespace
}  // namespace dhelix::cuda
