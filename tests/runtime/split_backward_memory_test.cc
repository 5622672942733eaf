// Activation memory of a split backward (docs/runtime.md, "Split backward"): the arena
// keeps what a deferred weight part W reads (the layer's saved activations and the output
// gradients of its GEMMs) until the W runs, and frees it there; the gradient reduction's
// last writer of a weight is its W.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/exec/stream_lowering.h"
#include "runtime/model/gradient_writers.h"
#include "runtime/model/stage_model.h"
#include "runtime/train/gradient_reduction.h"
#include "tests/plan/split_backward.h"
#include "tests/runtime/shipped_plan.h"

namespace dhelix::rt {
namespace {

struct LaidOut {
  RankProgram program;  // co-executed, rank 0
  MemoryReport report;
};

// Rank 0 of `p`, laid out for both of its programs (as activation_arena_test.cc does).
LaidOut laid_out(const PlannedJob& p) {
  LaidOut out;
  out.program = lower_rank_program(p.plan, p.job, 0, ExecutionMode::kCoExecuted);
  const RankProgram seq = lower_rank_program(p.plan, p.job, 0, ExecutionMode::kSequential);
  const PlanStage& stage = p.plan.stages.front();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
    if (range.count > 0) ranges.emplace_back(range.first, range.count);
  }
  StageModel model(p.job, 0, ranges, stage.embedding, stage.head_loss, 7);
  model.plan_activation_memory({&out.program, &seq}, program_orders({&out.program, &seq}));
  model.fill_memory_report(out.report);
  return out;
}

int64_t position_of(const RankProgram& program, std::string_view op, int64_t layer,
                    int64_t micro_batch) {
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    if (in.op == op && in.layer == layer && in.micro_batch == micro_batch) {
      return static_cast<int64_t>(i);
    }
  }
  ADD_FAILURE() << op << " layer " << layer << " mb " << micro_batch << " not in the program";
  return -1;
}

const ArenaBufferRecord& buffer(const MemoryReport& report, const std::string& name) {
  for (const ArenaBufferRecord& b : report.buffers) {
    if (b.name == name) return b;
  }
  ADD_FAILURE() << "no buffer " << name;
  static const ArenaBufferRecord none;
  return none;
}

// tiny-tp2 (TP 2 with SP, one stage, layers 0-1 down and 2-3 up, 2 micro-batches) ends in
// B1u, B1d; split with W deferred to the end: I1u, I1d, W1u, W1d. Layer 3 of micro-batch 1
// (B1u's first layer): what its four weight-gradient GEMMs read lives until the W reads it
// last, not until the end of I1u, and is free after.
TEST(SplitBackwardMemory, WeightInputsLiveUntilTheirWeightPart) {
  PlannedJob whole = shipped("tiny-tp2");
  PlannedJob split = shipped("tiny-tp2");
  testing::split_lone_backwards(split.plan, 8);
  const LaidOut w = laid_out(whole);
  const LaidOut s = laid_out(split);
  // The W ops read (layer_ops_backward.h): fc2_wgrad act and d_mlp_full, fc1_wgrad mlp_in
  // and d_gate_up, proj_wgrad attn_out and d_attn_full, qkv_wgrad attn_in and d_qkv. The
  // buffers of one span live and die together (buffer_spans.h): the saved span's with the
  // layer's last W op (qkv_wgrad), the MLP block's backward span's with its last
  // (fc1_wgrad), the attention block's with qkv_wgrad.
  const std::map<std::string, std::string> last_reader = {
      {"mb1.L3.saved.act", "bwd.qkv_wgrad"},
      {"mb1.L3.saved.mlp_in", "bwd.qkv_wgrad"},
      {"mb1.L3.saved.attn_out", "bwd.qkv_wgrad"},
      {"mb1.L3.saved.attn_in", "bwd.qkv_wgrad"},
      {"mb1.L3.mlp_backward.d_mlp_full", "bwd.fc1_wgrad"},
      {"mb1.L3.mlp_backward.d_gate_up", "bwd.fc1_wgrad"},
      {"mb1.L3.attention_backward.d_attn_full", "bwd.qkv_wgrad"},
      {"mb1.L3.attention_backward.d_qkv", "bwd.qkv_wgrad"},
  };
  const int64_t input_end = position_of(s.program, "bwd.ln_attn", 3, 1);  // I1u's layer 3 done
  for (const auto& [name, reader] : last_reader) {
    const ArenaBufferRecord& split_buffer = buffer(s.report, name);
    const ArenaBufferRecord& whole_buffer = buffer(w.report, name);
    EXPECT_EQ(split_buffer.last_instruction, position_of(s.program, reader, 3, 1)) << name;
    EXPECT_GT(split_buffer.last_instruction, input_end) << name;
    // Unsplit, the same buffer dies inside B1u.
    EXPECT_LE(whole_buffer.last_instruction, position_of(w.program, "bwd.ln_attn", 3, 1)) << name;
    EXPECT_EQ(split_buffer.bytes, whole_buffer.bytes) << name;
  }
  // Deferring keeps more alive at once: the live peak grows (1729024 -> 2549760 bytes), the
  // arena holds it.
  EXPECT_GT(s.report.activation_live_peak_bytes, w.report.activation_live_peak_bytes);
  EXPECT_GE(s.report.activation_arena_bytes, s.report.activation_live_peak_bytes);
}

// The bytes a deferred W holds, by hand. tiny-tp2 on one rank: T = 128 tokens (2 x 64),
// 64 rows under SP, hidden 64, q width 32 and kv width 16 a rank, ffn 64 a rank, fp32. Per
// (micro-batch, layer), the spans a W op uses (stage_model_state.h):
//   saved       q 16384, k 8192, v 8192, attn_out 16384, lse 1024, ln1_rstd 256,
//               attn_in 32768, h1 16384, ln2_rstd 256, mlp_in 32768, gate_up 65536,
//               act 32768                                                    = 230912
//   backward    d_h1 16384                                                   =  16384
//   mlp_backward d_mlp_full 32768, d_act 32768, d_gate_up 65536, d_mlp_in 32768,
//               d_ln2_out 16384                                              = 180224
//   attention_backward d_attn_full 32768, d_attn_out 16384, dq 16384, dk 8192, dv 8192,
//               d_qkv 32768, d_attn_in 32768, d_ln1_out 16384, attn_delta 1024 = 164864
// 592384 a layer. With W1u deferred past I1d, B1u's two layers (3 and 2) hold all of it
// through I1d: 1184768 bytes; unsplit, none of it is live during B1d.
TEST(SplitBackwardMemory, DeferredWeightHoldsItsLayersSpansThroughTheTasksBetween) {
  PlannedJob whole = shipped("tiny-tp2");
  PlannedJob split = shipped("tiny-tp2");
  testing::split_lone_backwards(split.plan, 8);
  const auto held_through = [](const LaidOut& l, const std::string& label, const Plan& plan) {
    int64_t task = -1;
    for (const PlanTask& t : plan.stages[0].tasks) {
      if (t.label == label) task = t.index;
    }
    int64_t first = -1, last = -1;
    for (size_t i = 0; i < l.program.instructions.size(); ++i) {
      if (l.program.instructions[i].task != task) continue;
      if (first < 0) first = static_cast<int64_t>(i);
      last = static_cast<int64_t>(i);
    }
    EXPECT_GE(first, 0) << label;
    int64_t bytes = 0;
    for (const ArenaBufferRecord& b : l.report.buffers) {
      const bool up_layers = b.name.starts_with("mb1.L2.") || b.name.starts_with("mb1.L3.");
      if (up_layers && b.first_instruction >= 0 && b.first_instruction <= first &&
          b.last_instruction >= last) {
        bytes += b.bytes;
      }
    }
    return bytes;
  };
  EXPECT_EQ(held_through(laid_out(split), "I1d", split.plan), 2 * 592384);
  EXPECT_EQ(held_through(laid_out(whole), "B1d", whole.plan), 0);
}

// A weight's gradient is final after its W, not after its I: the overlapped reduction's
// buckets (gradient_reduction.h) wait for the last W of the step that writes them.
TEST(SplitBackwardMemory, GradientIsFinalAfterItsWeightPart) {
  PlannedJob split = shipped("tiny-tp2");
  testing::split_lone_backwards(split.plan, 8);
  const RankProgram program =
      lower_rank_program(split.plan, split.job, 0, ExecutionMode::kCoExecuted);
  const std::vector<int64_t> last = last_gradient_writers(
      {"layers.3.w_fc2", "layers.3.w_qkv", "layers.3.ln_mlp", "layers.0.w_fc1"}, program);
  // Micro-batch 1 writes last; its layer-3 weights in W1u, layer 0's in W1d (the very end),
  // the norm gain (no GEMM) in I1u.
  EXPECT_EQ(last[0], position_of(program, "bwd.fc2_wgrad", 3, 1));
  EXPECT_EQ(last[1], position_of(program, "bwd.qkv_wgrad", 3, 1));
  EXPECT_EQ(last[2], position_of(program, "bwd.ln_mlp", 3, 1));
  EXPECT_EQ(last[3], position_of(program, "bwd.fc1_wgrad", 0, 1));
  EXPECT_GT(last[1], position_of(program, "bwd.ln_attn", 0, 1));  // after all of I1d
}

}  // namespace
}  // namespace dhelix::rt
