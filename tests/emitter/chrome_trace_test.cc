#include "emitter/chrome_trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "emitter/task_expansion.h"
#include "lib/error.h"
#include "lib/plan/plan_reader.h"
#include "tests/emitter/picture_fixture.h"

namespace dhelix {
namespace {

using testing::fixture_plan;

const ExpandedOp& find_op(const std::vector<ExpandedOp>& ops, const std::string& name,
                          int64_t layer) {
  for (const ExpandedOp& op : ops) {
    if (op.name == name && op.layer == layer) return op;
  }
  ADD_FAILURE() << "no op " << name << " of layer " << layer;
  static const ExpandedOp kNone;
  return kNone;
}

TEST(TaskExpansion, SiBlockRepeatsTheLayerBlocks) {
  const Plan plan = fixture_plan();
  const auto ops = expand_task(plan, plan.stages[0], plan.stages[0].tasks[4]);
  ASSERT_EQ(ops.size(), 14u);  // 7 timings x 2 layer pairs, no extra time
  // Pair 1: forward layer 1 (down 0-1 upwards), backward layer 6 (up 6-7 downwards); its
  // block 1 starts at 250 + 22 + 16 + 22 = 310. Blocks are numbered in their template, as
  // the report and the pairing picture number them.
  const ExpandedOp& fb = find_op(ops, "f.b", 1);
  EXPECT_DOUBLE_EQ(fb.start_us, 312);
  EXPECT_DOUBLE_EQ(fb.end_us, 318);
  EXPECT_EQ(fb.block, 1);
  EXPECT_STREQ(fb.blocks, "layer");
  EXPECT_EQ(fb.micro_batch, 2);
  EXPECT_EQ(fb.strand, Pass::kForward);
  EXPECT_FALSE(fb.approximate);
  const ExpandedOp& by = find_op(ops, "b.y", 7);  // pair 0's backward layer
  EXPECT_DOUBLE_EQ(by.start_us, 280);
  EXPECT_DOUBLE_EQ(by.end_us, 288);
  EXPECT_EQ(by.micro_batch, 0);
  EXPECT_EQ(by.stream, StreamClass::kCompute);
  EXPECT_EQ(find_op(ops, "b.kv", 6).group, ParallelDim::kCp);
  EXPECT_EQ(ops.front().name, "f.a");  // start order
  EXPECT_DOUBLE_EQ(ops.back().end_us, 326);
}

TEST(TaskExpansion, ForwardEmbeddingGoesBeforeTheLayers) {
  const Plan plan = fixture_plan();
  const auto ops = expand_task(plan, plan.stages[0], plan.stages[0].tasks[0]);
  ASSERT_EQ(ops.size(), 7u);
  EXPECT_EQ(ops[0].name, "embedding.fwd");
  EXPECT_DOUBLE_EQ(ops[0].start_us, 0);
  EXPECT_DOUBLE_EQ(ops[0].end_us, 5);
  EXPECT_EQ(ops[0].layer, -1);
  EXPECT_FALSE(ops[0].strand.has_value());
  const ExpandedOp& fag = find_op(ops, "f.ag", 0);
  EXPECT_DOUBLE_EQ(fag.start_us, 15);
  EXPECT_DOUBLE_EQ(fag.end_us, 19);
  EXPECT_TRUE(fag.approximate);
  EXPECT_DOUBLE_EQ(find_op(ops, "f.b", 1).end_us, 45);
}

TEST(TaskExpansion, StrandAloneOpsAreSqueezedIntoAShortTask) {
  const Plan plan = fixture_plan();
  // F0u: 2 x 20 us of solo time in 36 us: every op at 0.9 of its solo time.
  const auto ops = expand_task(plan, plan.stages[0], plan.stages[0].tasks[2]);
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_DOUBLE_EQ(find_op(ops, "f.a", 6).end_us, 209);
  EXPECT_DOUBLE_EQ(find_op(ops, "f.ag", 6).end_us, 212.6);
  EXPECT_DOUBLE_EQ(find_op(ops, "f.a", 7).start_us, 218);
  EXPECT_DOUBLE_EQ(ops.back().end_us, 236);
}

TEST(TaskExpansion, BackwardEmbeddingGoesAfterTheLayers) {
  const Plan plan = fixture_plan();
  const auto ops = expand_task(plan, plan.stages[0], plan.stages[0].tasks[5]);
  ASSERT_EQ(ops.size(), 9u);
  EXPECT_DOUBLE_EQ(find_op(ops, "b.x", 1).start_us, 400);  // backward walks down: layer 1 first
  EXPECT_DOUBLE_EQ(find_op(ops, "b.kv", 1).end_us, 428);
  EXPECT_DOUBLE_EQ(find_op(ops, "b.x", 0).start_us, 428);
  EXPECT_EQ(ops.back().name, "embedding.bwd");
  EXPECT_DOUBLE_EQ(ops.back().start_us, 456);
  EXPECT_DOUBLE_EQ(ops.back().end_us, 460);
  EXPECT_EQ(ops.back().micro_batch, 0);
}

TEST(TaskExpansion, HeadLossIsOneStep) {
  const Plan plan = fixture_plan();
  const auto ops = expand_task(plan, plan.stages[0], plan.stages[0].tasks[3]);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].name, "head_loss");
  EXPECT_EQ(ops[0].micro_batch, 0);
  EXPECT_DOUBLE_EQ(ops[0].end_us - ops[0].start_us, 14);
}

TEST(TaskExpansion, ChunkScopeRunsWindowsThenTheRemainder) {
  Plan plan = fixture_plan();
  PlanPairing& p = plan.pairings[0];
  p.scope = PairingScope::kChunk;
  p.chunk_layers = 3;
  p.window_layers = 2;
  p.window_blocks = testing::window_layer_blocks(p.layer_blocks, 0);
  for (const PlanBlock& b : testing::window_layer_blocks(p.layer_blocks, 1)) {
    p.window_blocks.push_back(b);
  }
  p.remainder_blocks = testing::window_layer_blocks(p.layer_blocks, 0);
  PlanTask& si = plan.stages[0].tasks[4];
  si.forward->layers = {0, 3};
  si.backward->layers = {5, 3};
  si.end_us = 250 + 3 * 38;
  const auto ops = expand_task(plan, plan.stages[0], si);
  ASSERT_EQ(ops.size(), 21u);
  // The window's L1 pairs forward layer 1 with backward layer 6; the remainder's L0 (the
  // task's third pair) forward layer 2 with backward layer 5.
  EXPECT_EQ(find_op(ops, "f.a", 1).block, 2);
  EXPECT_STREQ(find_op(ops, "f.a", 1).blocks, "window");
  EXPECT_DOUBLE_EQ(find_op(ops, "f.a", 1).start_us, 288);
  EXPECT_DOUBLE_EQ(find_op(ops, "b.x", 6).start_us, 298);
  EXPECT_EQ(find_op(ops, "f.a", 2).block, 0);
  EXPECT_STREQ(find_op(ops, "f.a", 2).blocks, "remainder");
  EXPECT_DOUBLE_EQ(find_op(ops, "b.kv", 5).start_us, 348);
  EXPECT_DOUBLE_EQ(ops.back().end_us, 364);
}

// An uneven fold's stage 0 pairs chunks of different sizes (docs/pipeline.md): the SI block
// pairs min(nf, nb) = 2 layers, then the backward's third layer (5, continuing 7, 6
// downwards) runs alone at solo times, as the lowering orders it (rank_program.cc).
TEST(TaskExpansion, UnequalSiLayerCountsPairTheShorterPartThenRunTheRestAlone) {
  Plan plan = fixture_plan();
  PlanTask& si = plan.stages[0].tasks[4];
  si.backward->layers = {5, 3};
  si.end_us = 354;
  const auto ops = expand_task(plan, plan.stages[0], si);
  ASSERT_EQ(ops.size(), 18u);  // 7 timings x 2 pairs, then the 4 backward ops of layer 5
  EXPECT_DOUBLE_EQ(find_op(ops, "b.y", 7).start_us, 280);  // pair 0 as before
  const ExpandedOp& bx = find_op(ops, "b.x", 5);
  EXPECT_DOUBLE_EQ(bx.start_us, 326);  // after the 2 x 38 us of blocks
  EXPECT_DOUBLE_EQ(bx.end_us, 338);
  EXPECT_EQ(bx.block, -1);
  EXPECT_TRUE(bx.approximate);
  EXPECT_EQ(bx.micro_batch, 0);
  EXPECT_DOUBLE_EQ(find_op(ops, "b.kv", 5).start_us, 351);  // b.x, b.rs, b.y, b.kv in order
  EXPECT_DOUBLE_EQ(ops.back().end_us, 354);
}

TEST(TaskExpansion, UnknownOpInATimingIsRefused) {
  Plan plan = fixture_plan();
  plan.pairings[0].layer_blocks[1].timings[2].op = "f.c";
  try {
    expand_task(plan, plan.stages[0], plan.stages[0].tasks[4]);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "plan: stage 0 task 4 (F2d+B0u): block timing names op 'f.c', which the "
                 "pairing lacks");
  }
}

TEST(TaskExpansion, SplitsWindowOpIds) {
  EXPECT_EQ(split_window_op_id("L12.fwd.gemm_qkv"),
            std::make_pair(int64_t{12}, std::string("fwd.gemm_qkv")));
  EXPECT_EQ(split_window_op_id("fwd.gemm"), std::make_pair(int64_t{0}, std::string("fwd.gemm")));
  EXPECT_EQ(split_window_op_id("Lx.fwd"), std::make_pair(int64_t{0}, std::string("Lx.fwd")));
  EXPECT_EQ(split_window_op_id("L.fwd"), std::make_pair(int64_t{0}, std::string("L.fwd")));
}

// ----- the trace's structure, on any plan ------------------------------------------------

// Checks what every trace must satisfy and returns the number of op slices.
int64_t check_trace_structure(const Plan& plan, const OrderedJson& trace) {
  const OrderedJson& events = trace.at("traceEvents");
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> by_thread;
  std::map<std::tuple<int64_t, std::string, int64_t, std::string, int64_t>, int> per_op;
  std::map<int64_t, std::vector<std::string>> flows;
  std::set<std::pair<int64_t, int64_t>> named_threads;
  int64_t op_slices = 0;
  for (const auto& e : events) {
    const std::string ph = e.at("ph");
    if (ph == "M") {
      if (e.at("name") == "thread_name")
        named_threads.insert({e.at("pid").get<int64_t>(), e.at("tid").get<int64_t>()});
      continue;
    }
    if (ph == "s" || ph == "f") {
      flows[e.at("id").get<int64_t>()].push_back(ph);
      continue;
    }
    EXPECT_EQ(ph, "X");
    const auto pid = e.at("pid").get<int64_t>();
    const auto tid = e.at("tid").get<int64_t>();
    EXPECT_TRUE(named_threads.count({pid, tid})) << e.dump();
    by_thread[{pid, tid}].push_back({e.at("ts").get<double>(), e.at("dur").get<double>()});
    // The task row, and the phases beside and after the tasks, are not ops.
    const std::string category = e.at("cat");
    if (tid == 0 || category == "iteration_end" || category == "dp" || category == "p2p") continue;
    ++op_slices;
    const auto& args = e.at("args");
    if (!args.contains("layer")) continue;
    ++per_op[{pid, args.at("task").get<std::string>(), args.at("micro_batch").get<int64_t>(),
              e.at("name").get<std::string>(), args.at("layer").get<int64_t>()}];
  }
  // No two slices of one thread overlap (1 ns of rounding allowed).
  for (auto& [thread, slices] : by_thread) {
    std::sort(slices.begin(), slices.end());
    for (size_t i = 1; i < slices.size(); ++i) {
      EXPECT_LE(slices[i - 1].first + slices[i - 1].second, slices[i].first + 0.0011)
          << "pid " << thread.first << " tid " << thread.second << " at " << slices[i].first;
    }
  }
  // Every op of the pairing appears exactly once per (task, layer of its strand).
  for (const PlanStage& stage : plan.stages) {
    const PlanPairing& pairing = plan.pairings[static_cast<size_t>(stage.pairing)];
    for (const PlanTask& task : stage.tasks) {
      const auto expect_strand = [&](const PlanTaskPart& part, const std::vector<PlanOp>& ops) {
        for (int64_t l = part.layers.first; l < part.layers.first + part.layers.count; ++l) {
          for (const PlanOp& op : ops) {
            EXPECT_EQ((per_op[{stage.stage, task.label, part.micro_batch, op.id, l}]), 1)
                << "stage " << stage.stage << " " << task.label << " " << op.id << " layer " << l;
          }
        }
      };
      if (task.forward) expect_strand(*task.forward, pairing.forward_ops);
      if (task.backward) expect_strand(*task.backward, pairing.backward_ops);
    }
  }
  // Flows pair up: one start, then one finish per id.
  for (const auto& [id, phases] : flows) {
    EXPECT_EQ(phases, (std::vector<std::string>{"s", "f"})) << "flow " << id;
  }
  return op_slices;
}

TEST(ChromeTrace, FixtureHasEveryOpOnceAndNoOverlaps) {
  const Plan plan = fixture_plan();
  const OrderedJson trace = chrome_trace(plan, {});
  EXPECT_EQ(check_trace_structure(plan, trace), 43 + 28);
  const OrderedJson& events = trace["traceEvents"];
  // 2 processes x (name, sort index, 4 threads x (name, sort index)).
  EXPECT_EQ(events[0].dump(),
            R"({"name":"process_name","ph":"M","pid":0,"args":{"name":"stage 0"}})");
  EXPECT_EQ(events[4].dump(),
            R"({"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"compute"}})");
  EXPECT_EQ(events[20].dump(),
            R"({"name":"F0d","cat":"task","ph":"X","ts":0.0,"dur":45.0,"pid":0,"tid":0,)"
            R"("cname":"thread_state_running","args":{"task":0,"kind":"forward",)"
            R"("forward":{"micro_batch":0,"chunk":"down","layers":"0-1"}}})");
  EXPECT_EQ(events[21].dump(),
            R"({"name":"embedding.fwd","cat":"extra","ph":"X","ts":0.0,"dur":5.0,"pid":0,)"
            R"("tid":1,"cname":"grey","args":{"task":"F0d","micro_batch":0}})");
  EXPECT_EQ(events[22].dump(),
            R"({"name":"f.a","cat":"fwd","ph":"X","ts":5.0,"dur":10.0,"pid":0,"tid":1,)"
            R"("cname":"thread_state_running","args":{"task":"F0d","micro_batch":0,"layer":0,)"
            R"("strand":"fwd","approximate":true}})");
  // 4 waits, 4 flows, counted by consumer: the first is stage 0's F0u (200-236) waiting for
  // stage 1's F0u (90-130), each end at its slice's middle.
  int64_t flow_events = 0;
  for (const auto& e : events) flow_events += e["ph"] == "s" || e["ph"] == "f";
  EXPECT_EQ(flow_events, 8);
  const auto& s = events[events.size() - 8];
  const auto& f = events[events.size() - 7];
  EXPECT_EQ(s.dump(), R"({"name":"p2p","cat":"p2p","ph":"s","id":1,"ts":110.0,"pid":1,"tid":0})");
  EXPECT_EQ(f.dump(),
            R"({"name":"p2p","cat":"p2p","ph":"f","id":1,"ts":218.0,"pid":0,"tid":0,"bp":"e"})");
  EXPECT_EQ(trace["otherData"]["schemes"].dump(),
            R"({"dhelix iteration_us":470.0,"megatron-1f1b iteration_us":520.0})");
}

TEST(ChromeTrace, SiBlockOpsCarryTheirBlock) {
  const Plan plan = fixture_plan();
  const OrderedJson trace = chrome_trace(plan, {});
  int64_t found = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "b.rs" && e["args"]["task"] == "F2d+B0u" &&
        e["args"]["layer"] == 7) {
      EXPECT_EQ(e["tid"], 2);  // local comm
      EXPECT_EQ(e["args"]["block"], 1);
      EXPECT_EQ(e["args"]["blocks"], "layer");
      EXPECT_EQ(e["args"]["group"], "tp");
      EXPECT_EQ(e["cname"], "thread_state_iowait");
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 272);
      ++found;
    }
  }
  EXPECT_EQ(found, 1);
}

// The fixture with what its stages do beside and after their tasks: stage 0 ends its tasks
// at 460 us, then 4 us of exposed reduction, a 5 us optimizer step and 1 us of exposed gather
// end it at 470 us, the plan's iteration; stage 1 ends at 442 + 8 + 5 + 2 = 457 us.
Plan fixture_with_phases() {
  Plan plan = fixture_plan();
  const auto phases = [](double reduce_exposed_us, double gather_exposed_us) {
    return PlanStagePhases{.p2p_us = 6,
                           .p2p_stream = StreamClass::kLocalComm,
                           .dp_reduce_hidden_us = 30,
                           .dp_reduce_exposed_us = reduce_exposed_us,
                           .dp_gather_hidden_us = 3,
                           .dp_gather_exposed_us = gather_exposed_us,
                           .dp_stream = StreamClass::kCrossComm,
                           .optimizer_us = 5};
  };
  plan.stages[0].phases = phases(4, 1);
  plan.stages[1].phases = phases(8, 2);
  return plan;
}

// name -> (ts, dur) of the X slices on one thread.
std::map<std::string, std::pair<double, double>> slices_of(const OrderedJson& trace, int64_t pid,
                                                           int64_t tid) {
  std::map<std::string, std::pair<double, double>> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid) {
      out[e["name"].get<std::string>() + "@" + std::to_string(e["ts"].get<double>())] = {
          e["ts"].get<double>(), e["dur"].get<double>()};
    }
  }
  return out;
}

TEST(ChromeTrace, PhasesAfterTheTasksEndAtTheIteration) {
  const Plan plan = fixture_with_phases();
  const OrderedJson trace = chrome_trace(plan, {});
  check_trace_structure(plan, trace);
  const auto tasks0 = slices_of(trace, 0, 0);
  EXPECT_EQ(tasks0.at("dp gradient reduction (exposed)@460.000000"), std::make_pair(460.0, 4.0));
  EXPECT_EQ(tasks0.at("optimizer step@464.000000"), std::make_pair(464.0, 5.0));
  EXPECT_EQ(tasks0.at("dp parameter gather (exposed)@469.000000"), std::make_pair(469.0, 1.0));
  EXPECT_EQ(slices_of(trace, 0, 1).at("optimizer step@464.000000"), std::make_pair(464.0, 5.0));
  // The DP row: the gather under the first forward, the reduction from 30 us before the last
  // task's end to its exposed end, then the exposed gather.
  const auto dp0 = slices_of(trace, 0, 5);
  EXPECT_EQ(dp0.at("dp parameter gather (hidden)@0.000000"), std::make_pair(0.0, 3.0));
  EXPECT_EQ(dp0.at("dp gradient reduction@430.000000"), std::make_pair(430.0, 34.0));
  EXPECT_EQ(dp0.at("dp parameter gather@469.000000"), std::make_pair(469.0, 1.0));
  // Stage 1 ends at 457 us.
  EXPECT_EQ(slices_of(trace, 1, 0).at("dp parameter gather (exposed)@455.000000"),
            std::make_pair(455.0, 2.0));
  // Sends: stage 0's F0d (ends 45) and F2d+B0u (326), stage 1's F0u (130) and B0d (442).
  const auto sends0 = slices_of(trace, 0, 4);
  EXPECT_EQ(sends0.size(), 2u);
  EXPECT_EQ(sends0.at("p2p send@45.000000"), std::make_pair(45.0, 6.0));
  EXPECT_EQ(sends0.at("p2p send@326.000000"), std::make_pair(326.0, 6.0));
  EXPECT_EQ(slices_of(trace, 1, 4).size(), 2u);
  std::set<std::string> thread_names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["name"] == "thread_name" && e["pid"] == 0) thread_names.insert(e["args"]["name"]);
  }
  EXPECT_TRUE(thread_names.count("local comm: pipeline sends"));
  EXPECT_TRUE(thread_names.count("cross comm: DP reduction"));
  EXPECT_EQ(trace["otherData"]["iteration_us"], 470.0);
}

TEST(ChromeTrace, APlanWithoutPhasesHasNoPhaseRows) {
  const OrderedJson trace = chrome_trace(fixture_plan(), {});
  EXPECT_TRUE(slices_of(trace, 0, 4).empty());
  EXPECT_TRUE(slices_of(trace, 0, 5).empty());
  for (const auto& e : trace["traceEvents"]) EXPECT_NE(e["name"], "optimizer step");
}

TEST(ChromeTrace, TaskSlicesOnlyAndMicroBatchLimit) {
  const Plan plan = fixture_plan();
  const OrderedJson tasks_only = chrome_trace(plan, {.expand_ops = false, .micro_batch_limit = -1});
  int64_t slices = 0;
  for (const auto& e : tasks_only["traceEvents"]) slices += e["ph"] == "X";
  EXPECT_EQ(slices, 10);
  // Micro-batch 0 only: F1d and F2d+B0u go, and with them the flow into F2d+B0u's consumer.
  const OrderedJson first = chrome_trace(plan, {.expand_ops = false, .micro_batch_limit = 1});
  std::vector<std::string> names;
  int64_t flow_events = 0;
  for (const auto& e : first["traceEvents"]) {
    if (e["ph"] == "X") names.push_back(e["name"]);
    flow_events += e["ph"] == "s";
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"F0d", "F0u", "H0", "B0d", "F0d", "F0u", "B0u", "B0d"}));
  EXPECT_EQ(flow_events, 3);
}

TEST(ChromeTrace, TextIsDeterministicAndParses) {
  const Plan plan = fixture_plan();
  const std::string a = chrome_trace_text(plan, {});
  EXPECT_EQ(a, chrome_trace_text(plan, {}));
  const Json parsed = Json::parse(a);
  EXPECT_EQ(parsed["traceEvents"].size(), chrome_trace(plan, {})["traceEvents"].size());
  EXPECT_EQ(parsed["displayTimeUnit"], "ms");
  EXPECT_EQ(a.substr(0, 17), "{\"traceEvents\": [");
}

TEST(ChromeTrace, ExamplePlansHaveEveryOpOnceAndNoOverlaps) {
  for (const char* name : {"llama-25b-a40-dp8-tp8", "llama-39b-a40-dp2-tp8-cp2-pp2-seq16k"}) {
    SCOPED_TRACE(name);
    const Plan plan =
        read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json");
    const OrderedJson trace = chrome_trace(plan, {});
    int64_t expected = 0;
    for (const PlanStage& stage : plan.stages) {
      const PlanPairing& p = plan.pairings[static_cast<size_t>(stage.pairing)];
      for (const PlanTask& t : stage.tasks) {
        if (t.forward)
          expected += t.forward->layers.count * static_cast<int64_t>(p.forward_ops.size());
        if (t.backward)
          expected += t.backward->layers.count * static_cast<int64_t>(p.backward_ops.size());
        // Each ends inside its task, up to the plan's rounding: block times are written to
        // 1e-3 us, and a task's ops are placed after the sum of its earlier blocks' times
        // (hundreds of blocks in a chunk: a few 1e-3 us).
        for (const ExpandedOp& op : expand_task(plan, stage, t)) {
          EXPECT_GE(op.start_us, t.start_us - 1e-6);
          EXPECT_LE(op.end_us, t.end_us + 1e-2)
              << t.label << " " << op.name << " over by " << op.end_us - t.end_us << " us";
        }
      }
    }
    const int64_t slices = check_trace_structure(plan, trace);
    // Op slices are the layer ops plus one step per head-loss task and embedding remainder.
    EXPECT_GE(slices, expected);
    EXPECT_LE(slices, expected + 3 * static_cast<int64_t>(plan.num_micro_batches));
  }
}

TEST(ChromeTrace, WriteTraceFileWritesWhatTheTextSays) {
  const Plan plan = fixture_plan();
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "dhelix-trace-test.json";
  write_trace_file(plan, path.string());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), chrome_trace_text(plan, {}));
  std::filesystem::remove(path);
  try {
    write_trace_file(plan, "/nonexistent-dir/trace.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

}  // namespace
}  // namespace dhelix
