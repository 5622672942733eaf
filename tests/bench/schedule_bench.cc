// What each scheme's schedule costs build_plan: its generator and one simulator pass, on the
// deepest shipped pipeline (Llama-3.1-405B: pp 16, 64 micro-batches) and a longer one. The
// configuration search calls build_plan thousands of times, so these must stay small next to
// the layer searches (docs/pipeline.md, "The baselines people run").
//   build/tests/bench/dhelix_schedule_bench
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "planner/baseline_schedules.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {
namespace {

std::vector<StageCosts> costs(int64_t pp) {
  StageCosts c;
  c.forward_chunk_us = 1000;
  c.backward_chunk_us = 2000;
  c.backward_weight_chunk_us = 700;
  c.si_block_us = 2500;
  c.p2p_us = 30;
  c.head_loss_forward_us = 400;
  c.head_loss_backward_us = 400;
  c.activation_bytes_per_layer = 1 << 20;
  return std::vector<StageCosts>(static_cast<size_t>(pp), c);
}

PipelineSchedule schedule(int scheme, int64_t pp, int64_t m) {
  switch (scheme) {
    case 0:
      return make_one_f_one_b_schedule(pp, m);
    case 1:
      return make_w_schedule(pp, m);
    case 2:
      return make_interleaved_schedule(pp, m, 4);
    case 3:
      return make_zb_h1_schedule(pp, m);
    case 4:
      return make_zb_v_schedule(pp, m, {}, kZbVPlannerExtraChunks);
    default:
      return make_dualpipev_schedule(pp, m);
  }
}

// Arguments: scheme (0 1F1B, 1 W, 2 interleaved v 4, 3 ZB-H1, 4 ZB-V, 5 DualPipeV), pp, m.
void BM_ScheduleAndSimulate(benchmark::State& state) {
  const int scheme = static_cast<int>(state.range(0));
  const int64_t pp = state.range(1);
  const int64_t m = state.range(2);
  const std::vector<StageCosts> c = costs(pp);
  for (auto _ : state) {
    const PipelineSimulation sim = simulate_pipeline(schedule(scheme, pp, m), c);
    benchmark::DoNotOptimize(sim.iteration_us);
  }
}
BENCHMARK(BM_ScheduleAndSimulate)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {16}, {64, 256}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dhelix

BENCHMARK_MAIN();
