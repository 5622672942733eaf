// The configuration search (dhelix-plan --search) on the spaces issue #17 set targets for,
// with the analytic model profile, every constraint off:
//   - Llama-3-70B on 64 H100s, global batch 1024 x 8192 tokens;
//   - Llama-3.1-405B on 1024 H100s, global batch 1024 x 8192;
//   - Mixtral-8x7B on 64 H100s, global batch 1024 x 4096;
//   - a slice of the first with CP 8 and TP 8 or 4 fixed (seconds; BM_SearchSlice).
// Each runs once (a search takes seconds to minutes); the counters give how many
// configurations were enumerated, refused by the job's rules, refused for static memory,
// pruned by their lower bound and planned, and the memo's shared searches. Process CPU time
// is measured, so that a loaded machine shows in the wall time only. Threads: the
// benchmark's argument (2, the development machine's cores; the tool uses every core).
//   build/tests/bench/dhelix_search_bench --benchmark_format=json
// docs/search.md records the figures.
#include <benchmark/benchmark.h>

#include <string>

#include "lib/cluster_presets.h"
#include "lib/model_reader.h"
#include "planner/config_search.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "profiler/model_search.h"

namespace dhelix::bench {
namespace {

SearchRequest request_for(const char* hf_config, int64_t gpus, int64_t gbs, int64_t seq) {
  SearchRequest r;
  r.base.model =
      read_model_file(std::string(DHELIX_SOURCE_DIR) + "/examples/models/hf/" + hf_config);
  r.base.cluster = find_cluster_preset("h100").value();
  r.base.parallel.global_batch_size = gbs;
  r.base.parallel.seq_length = seq;
  r.base.name = r.base.model.name;
  r.gpus = gpus;
  use_model_profiles(r);
  return r;
}

void BM_Search(benchmark::State& state, const char* hf_config, int64_t gpus, int64_t gbs,
               int64_t seq) {
  SearchRequest request = request_for(hf_config, gpus, gbs, seq);
  request.threads = state.range(0);
  SearchResult result;
  for (auto _ : state) result = search_configurations(request);
  const SearchCounts& n = result.counts;
  state.counters["enumerated"] = static_cast<double>(n.enumerated);
  state.counters["invalid"] = static_cast<double>(n.invalid);
  state.counters["no_memory"] = static_cast<double>(n.no_memory);
  state.counters["pruned"] = static_cast<double>(n.pruned);
  state.counters["planned"] = static_cast<double>(n.planned);
  state.counters["dhelix_fits"] = static_cast<double>(n.dhelix_fits);
  const ConfigOutcome* best = result.best_dhelix();
  const ConfigOutcome* megatron = result.best_megatron();
  if (best != nullptr) state.counters["best_dhelix_s"] = best->dhelix.iteration_us / 1e6;
  if (megatron != nullptr) {
    state.counters["best_megatron_s"] = megatron->megatron.iteration_us / 1e6;
  }
  state.SetLabel(best != nullptr ? best->label : "none fits");
}

// A slice of the Llama-3-70B space that finishes in seconds: CP 8 and TP 8 fixed, micro-batch
// 1, the config's recompute setting only. CP layers dominate the full space (each distinct
// layer shape is one exact pairing search), so this follows the planner's speed there.
void BM_SearchSlice_Llama3_70B_Cp8(benchmark::State& state) {
  SearchRequest request = request_for("llama-3-70b.config.json", 64, 1024, 8192);
  request.constraints.cp = 8;
  request.constraints.tp = state.range(0);
  request.constraints.micro_batch_size = 1;
  request.constraints.search_recompute = false;
  request.threads = 1;
  SearchResult result;
  for (auto _ : state) result = search_configurations(request);
  state.counters["planned"] = static_cast<double>(result.counts.planned);
  const ConfigOutcome* best = result.best_dhelix();
  state.SetLabel(best != nullptr ? best->label : "none fits");
}

BENCHMARK(BM_SearchSlice_Llama3_70B_Cp8)
    ->Arg(8)
    ->Arg(4)
    ->Iterations(1)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Search, llama3_70b_64xh100, "llama-3-70b.config.json", 64, 1024, 8192)
    ->Arg(2)
    ->Iterations(1)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Search, mixtral_8x7b_64xh100, "mixtral-8x7b-v0.1.config.json", 64, 1024, 4096)
    ->Arg(2)
    ->Iterations(1)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Search, llama31_405b_1024xh100, "llama-3.1-405b.config.json", 1024, 1024, 8192)
    ->Arg(2)
    ->Iterations(1)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace dhelix::bench

BENCHMARK_MAIN();
