// Pairing search speed: the downset DP on full layers, against the naive reference
// (enumerate topological orders, then the paper's three-move DP per order pair).
// The naive reference cannot finish on a full layer (millions of order pairs), so it is
// measured (a) completely on the MLP half of the Llama layer, where the ratio is a true
// measurement, and (b) on the first few orders of each full strand, where the counters
// extrapolate linearly to all order pairs (time per order pair x number of order pairs).
#include <benchmark/benchmark.h>

#include "planner/brute_force_pairing.h"
#include "planner/pairing_search.h"
#include "tests/bench/bench_layers.h"

namespace dhelix::bench {
namespace {

// Slow-downs by stream pair, typical of compute/NCCL interference on one GPU.
class StreamPairModel final : public CoRunModel {
 public:
  double rate(const StrandOp& a, const StrandOp& b) const override {
    static constexpr double kRates[3][3] = {
        {1.0, 0.88, 0.93},  // compute while compute / local / cross comm runs
        {0.90, 1.0, 0.97},  // local comm while ...
        {0.92, 0.97, 1.0},  // cross comm while ...
    };
    return kRates[static_cast<int>(a.stream)][static_cast<int>(b.stream)];
  }
};

void report(benchmark::State& state, const PairingResult& r) {
  state.counters["optimum_us"] = r.total_time_us;
  state.counters["sequential_us"] = r.sequential_time_us;
  state.counters["fwd_downsets"] = static_cast<double>(r.stats.forward_downsets);
  state.counters["bwd_downsets"] = static_cast<double>(r.stats.backward_downsets);
  state.counters["transitions"] = static_cast<double>(r.stats.transitions);
  state.counters["simulated"] = static_cast<double>(r.stats.block_simulations);
}

void run_dp(benchmark::State& state, const StrandGraph& f, const StrandGraph& b,
            PairingOptions options) {
  const StreamPairModel rates;
  const BlockCostModel model(f, b, rates);
  options.prune = state.range(0) != 0;
  PairingResult r;
  for (auto _ : state) {
    r = search_pairing(model, options);
    benchmark::DoNotOptimize(&r);  // (a pointer: 1.7's "+m,r" form can clobber doubles)
  }
  report(state, r);
}

void BM_DownsetDp_Llama70B_Tp8Cp2(benchmark::State& state) {
  run_dp(state, llama70b_tp8_cp2_forward(), llama70b_tp8_cp2_backward(), {});
}
void BM_DownsetDp_MoeEp8(benchmark::State& state) {
  run_dp(state, moe_ep8_forward(), moe_ep8_backward(), {});
}
void BM_DownsetDp_LlamaMlpHalf(benchmark::State& state) {
  run_dp(state, llama70b_mlp_forward(), llama70b_mlp_backward(), {});
}
// Two layers per strand (sinks stay in their layer), segments of at most 8 ops.
void BM_DownsetDp_Llama70B_TwoLayers_Seg8(benchmark::State& state) {
  const StrandGraph f = llama70b_tp8_cp2_forward(), b = llama70b_tp8_cp2_backward();
  PairingOptions options;
  options.max_segment_ops = 8;
  run_dp(state, concatenate_layers({f, f}), concatenate_layers({b, b}), options);
}

void run_naive(benchmark::State& state, const StrandGraph& f, const StrandGraph& b,
               int64_t max_orders) {
  const StreamPairModel rates;
  const BlockCostModel model(f, b, rates);
  NaiveOptions options;
  options.max_orders_per_strand = max_orders;
  NaiveResult r;
  for (auto _ : state) {
    r = naive_order_pairing(model, options);
    benchmark::DoNotOptimize(&r);  // (a pointer: 1.7's "+m,r" form can clobber doubles)
  }
  const double pairs = static_cast<double>(r.forward_orders) * r.backward_orders;
  const double all_pairs = static_cast<double>(r.forward_orders_total) * r.backward_orders_total;
  state.counters["order_pairs"] = pairs;
  state.counters["all_order_pairs"] = all_pairs;
  state.counters["complete"] = r.complete ? 1 : 0;
  state.counters["best_found_us"] = r.total_time_us;
  // Seconds per run / pairs searched * all pairs: the full naive run, extrapolated.
  state.counters["s_per_order_pair"] = benchmark::Counter(
      pairs, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["extrapolated_full_s"] =
      benchmark::Counter(pairs / all_pairs, benchmark::Counter::kIsIterationInvariantRate |
                                                benchmark::Counter::kInvert);
}

void BM_Naive_LlamaMlpHalf_Complete(benchmark::State& state) {
  run_naive(state, llama70b_mlp_forward(), llama70b_mlp_backward(), 0);
}
void BM_Naive_Llama70B_Tp8Cp2_FirstOrders(benchmark::State& state) {
  run_naive(state, llama70b_tp8_cp2_forward(), llama70b_tp8_cp2_backward(), state.range(0));
}
void BM_Naive_MoeEp8_FirstOrders(benchmark::State& state) {
  run_naive(state, moe_ep8_forward(), moe_ep8_backward(), state.range(0));
}

// Arg: 1 = pruning on (the default), 0 = off (to show what it saves).
BENCHMARK(BM_DownsetDp_Llama70B_Tp8Cp2)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DownsetDp_MoeEp8)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DownsetDp_LlamaMlpHalf)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DownsetDp_Llama70B_TwoLayers_Seg8)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Naive_LlamaMlpHalf_Complete)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Naive_Llama70B_Tp8Cp2_FirstOrders)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Naive_MoeEp8_FirstOrders)->Arg(4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dhelix::bench

BENCHMARK_MAIN();
