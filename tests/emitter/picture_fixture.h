#pragma once
// A small hand-made plan for the trace and picture tests, with times easy to follow by hand.
//
// One layer's forward: f.a (compute, 10 us), f.ag (local comm, tp, 4 us), f.b (compute, 6 us).
// One layer's backward: b.x (compute, 12), b.rs (local comm, tp, 5), b.y (compute, 8),
// b.kv (cross comm, cp, 3). The layer pairing has two blocks:
//
//   block 0 (22 us): f.a 0-10, b.x 10-22, f.ag 10-14 (hidden under b.x)
//   block 1 (16 us): b.rs 0-5, b.kv 0-3, f.b 2-8, b.y 8-16
//                    (b.rs exposed 0-2, b.kv exposed 0-2)
//
// Two stages of two layers per chunk (stage 0: down 0-1, up 6-7; stage 1: down 2-3, up 4-5);
// stage 0 holds the embedding and the head. Task lists (start-end in us):
//
//   stage 0: F0d 0-45 (5 us embedding), F1d 45-85, F0u 200-236 (waits 1/1, squeezed to 0.9),
//            H0 236-250, F2d+B0u 250-326 (SI, 2 x 38 us), B0d 400-460 (4 us embedding,
//            waits 1/3)
//   stage 1: F0d 50-90 (waits 0/0), F0u 90-130, B0u 330-386 (waits 0/4), B0d 386-442

#include "lib/plan/plan.h"

namespace dhelix::testing {

// The fixture is written with the file's names; they are parsed here, at its edge.
inline PlanOp fixture_op(const char* id, const char* stream, const char* group, double solo_us) {
  const StreamClass s = kStreamClassNames.parse(stream).value();
  return {.id = id,
          .kind = s == StreamClass::kCompute ? OpKind::kGemm : OpKind::kAllGather,
          .stream = s,
          .group = kParallelDimNames.parse(group),
          .signature = std::string("sig:") + id,
          .solo_us = solo_us};
}

inline PlanTask fixture_task(int64_t index, const char* kind, const char* label, double start_us,
                             double end_us) {
  PlanTask t;
  t.index = index;
  t.kind = kTaskKindNames.parse(kind).value();
  t.label = label;
  t.start_us = start_us;
  t.end_us = end_us;
  return t;
}

inline PlanTask with_forward(PlanTask t, int64_t mb, const char* chunk, int64_t first) {
  t.forward = PlanTaskPart{
      .micro_batch = mb, .chunk = kChunkSideNames.parse(chunk).value(), .layers = {first, 2}};
  return t;
}

inline PlanTask with_backward(PlanTask t, int64_t mb, const char* chunk, int64_t first) {
  t.backward = PlanTaskPart{
      .micro_batch = mb, .chunk = kChunkSideNames.parse(chunk).value(), .layers = {first, 2}};
  return t;
}

inline PlanTask waiting(PlanTask t, int64_t stage, int64_t task) {
  t.waits_for.push_back({stage, task});
  return t;
}

inline PlanPairing fixture_pairing() {
  PlanPairing p;
  p.forward_ops = {fixture_op("f.a", "compute", "", 10), fixture_op("f.ag", "local_comm", "tp", 4),
                   fixture_op("f.b", "compute", "", 6)};
  p.backward_ops = {fixture_op("b.x", "compute", "", 12), fixture_op("b.rs", "local_comm", "tp", 5),
                    fixture_op("b.y", "compute", "", 8), fixture_op("b.kv", "cross_comm", "cp", 3)};
  p.scope = PairingScope::kLayer;
  p.chunk_layers = 2;
  p.window_layers = 1;
  p.layer_pair_us = 38;
  p.layer_scope_us = 76;
  p.chunk_scope_us = 76;
  p.sequential_us = 96;
  p.layer_blocks = {{.time_us = 22,
                     .forward_ops = {"f.a", "f.ag"},
                     .backward_ops = {"b.x"},
                     .timings = {{Pass::kForward, "f.a", 0, 10},
                                 {Pass::kBackward, "b.x", 10, 22},
                                 {Pass::kForward, "f.ag", 10, 14}}},
                    {.time_us = 16,
                     .forward_ops = {"f.b"},
                     .backward_ops = {"b.rs", "b.kv", "b.y"},
                     .timings = {{Pass::kBackward, "b.rs", 0, 5},
                                 {Pass::kBackward, "b.kv", 0, 3},
                                 {Pass::kForward, "f.b", 2, 8},
                                 {Pass::kBackward, "b.y", 8, 16}}}};
  return p;
}

/// `blocks` with every op id prefixed "L<k>." (a window layer).
inline std::vector<PlanBlock> window_layer_blocks(const std::vector<PlanBlock>& blocks, int k) {
  std::vector<PlanBlock> out = blocks;
  const std::string prefix = "L" + std::to_string(k) + ".";
  for (PlanBlock& b : out) {
    for (auto& id : b.forward_ops) id = prefix + id;
    for (auto& id : b.backward_ops) id = prefix + id;
    for (PlanOpTiming& t : b.timings) t.op = prefix + t.op;
  }
  return out;
}

inline Plan fixture_plan() {
  Plan plan;
  plan.job.name = "fixture";
  plan.num_micro_batches = 3;
  plan.pairings = {fixture_pairing()};
  PlanStage s0;
  s0.stage = 0;
  s0.down_layers = {0, 2};
  s0.up_layers = {6, 2};
  s0.embedding = true;
  s0.head_loss = true;
  s0.tasks = {
      with_forward(fixture_task(0, "forward", "F0d", 0, 45), 0, "down", 0),
      with_forward(fixture_task(1, "forward", "F1d", 45, 85), 1, "down", 0),
      waiting(with_forward(fixture_task(2, "forward", "F0u", 200, 236), 0, "up", 6), 1, 1),
      [] {
        PlanTask t = fixture_task(3, "head_loss", "H0", 236, 250);
        t.head_loss_micro_batch = 0;
        return t;
      }(),
      with_backward(with_forward(fixture_task(4, "si_block", "F2d+B0u", 250, 326), 2, "down", 0), 0,
                    "up", 6),
      waiting(with_backward(fixture_task(5, "backward", "B0d", 400, 460), 0, "down", 0), 1, 3),
  };
  PlanStage s1;
  s1.stage = 1;
  s1.down_layers = {2, 2};
  s1.up_layers = {4, 2};
  s1.tasks = {
      waiting(with_forward(fixture_task(0, "forward", "F0d", 50, 90), 0, "down", 2), 0, 0),
      with_forward(fixture_task(1, "forward", "F0u", 90, 130), 0, "up", 4),
      waiting(with_backward(fixture_task(2, "backward", "B0u", 330, 386), 0, "up", 4), 0, 4),
      with_backward(fixture_task(3, "backward", "B0d", 386, 442), 0, "down", 2),
  };
  plan.stages = {s0, s1};
  PlanScheme dhelix_scheme;
  dhelix_scheme.scheme = PipelineScheme::kDHelix;
  dhelix_scheme.shape = PipelineShape::kW;
  dhelix_scheme.iteration_us = 470;
  dhelix_scheme.speedup_vs_megatron = 520.0 / 470.0;
  PlanScheme megatron = dhelix_scheme;
  megatron.scheme = PipelineScheme::kMegatron1F1B;
  megatron.shape = PipelineShape::kOneFOneB;
  megatron.iteration_us = 520;
  megatron.speedup_vs_megatron = 1;
  plan.schemes = {dhelix_scheme, megatron};
  return plan;
}

}  // namespace dhelix::testing
