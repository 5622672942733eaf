// Plan reading, lowering and checking speed on the shipped plans, as dhelix-plan --check and
// dhelix-run run them:
//   - read_plan of examples/plans/llama-25b-a40-dp8-tp8.json (64 ranks, 24 micro-batches);
//   - lowering of one rank of that plan, co-executed and sequential;
//   - the whole check of the tiny TP2 + PP2 plan.
// tests/bench/compare_builds.sh runs this benchmark of two builds (e.g. before and after a
// change) alternately in one run and prints their ratios; docs/design.md records them.
// To compare with a build from before lib/plan/ existed, build a copy of this file there with
// the headers' old paths (lib/plan_check.h, ...).
#include <benchmark/benchmark.h>

#include <string>

#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"

namespace dhelix::bench {
namespace {

std::string example_plan(const char* name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name;
}

void BM_ReadPlan(benchmark::State& state) {
  const std::string path = example_plan("llama-25b-a40-dp8-tp8.json");
  for (auto _ : state) {
    Plan plan = read_plan(path);
    benchmark::DoNotOptimize(&plan);
  }
}
BENCHMARK(BM_ReadPlan)->Unit(benchmark::kMillisecond);

void BM_LowerRank(benchmark::State& state, const char* name, ExecutionMode mode) {
  const std::string path = example_plan(name);
  const Plan plan = read_plan(path);
  const JobSpec job = job_from_plan(plan, path);
  size_t instructions = 0;
  for (auto _ : state) {
    RankProgram program = lower_rank_program(plan, job, 0, mode);
    instructions = program.instructions.size();
    benchmark::DoNotOptimize(&program);
  }
  state.counters["instructions"] = static_cast<double>(instructions);
}
BENCHMARK_CAPTURE(BM_LowerRank, llama25b_co_executed, "llama-25b-a40-dp8-tp8.json",
                  ExecutionMode::kCoExecuted)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LowerRank, llama25b_sequential, "llama-25b-a40-dp8-tp8.json",
                  ExecutionMode::kSequential)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LowerRank, llama39b_cp2_pp2, "llama-39b-a40-dp2-tp8-cp2-pp2-seq16k.json",
                  ExecutionMode::kCoExecuted)
    ->Unit(benchmark::kMillisecond);

void BM_CheckPlan(benchmark::State& state) {
  const std::string path = example_plan("tiny-tp2-pp2.json");
  const Plan plan = read_plan(path);
  for (auto _ : state) {
    PlanCheckReport report = check_plan(plan, path);
    benchmark::DoNotOptimize(&report);
  }
}
BENCHMARK(BM_CheckPlan)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dhelix::bench

BENCHMARK_MAIN();
