// Plan reading, lowering and checking speed on the shipped plans, as dhelix-plan --check and
// dhelix-run run them:
//   - read_plan of examples/plans/llama-25b-a40-dp8-tp8.json (64 ranks, 24 micro-batches);
//   - lowering of one rank of that plan, co-executed and sequential;
//   - the whole check (dhelix-plan --check) of the tiny TP2 + PP2 plan, of the llama-25b plan
//     (64 ranks, 7.5M instructions) and of the llama-66b-a800-dp1-tp8-cp4-pp2-seq32k plan
//     (64 ranks, 29.4M instructions; planned at build time into the build folder, see
//     CMakeLists.txt): targets 5 s and 15 s CPU (issue 15), docs/plan-check.md records them.
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

void BM_CheckLargePlan(benchmark::State& state, const std::string& path) {
  const Plan plan = read_plan(path);
  int64_t instructions = 0;
  for (auto _ : state) {
    PlanCheckReport report = check_plan(plan, path);
    if (!report.ok()) state.SkipWithError("the plan does not pass its check");
    instructions = report.summary.instructions;
    benchmark::DoNotOptimize(&report);
  }
  state.counters["instructions"] = static_cast<double>(instructions);
}
BENCHMARK_CAPTURE(BM_CheckLargePlan, llama25b, example_plan("llama-25b-a40-dp8-tp8.json"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CheckLargePlan, llama66b_cp4, std::string(DHELIX_BENCH_LLAMA66B_CP4_PLAN))
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dhelix::bench

BENCHMARK_MAIN();
