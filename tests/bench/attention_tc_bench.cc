// Throughput of the tensor-core attention kernels (runtime/cuda/attention_tc.h): plain
// causal forward and backward, and one CP ring step forward and backward, each timed with
// CUDA events (3 warm-up runs, then the mean of `--reps`), printed as milliseconds and
// achieved TFLOP/s. Not a test: docs/gpu.md says what to expect on an H100 and how to read
// it. Without a GPU it prints "no GPU" and exits 0.
//
// FLOPs count the useful work only, FlashAttention-2's convention: 4 d per visible (query,
// key) pair and query head for the forward (two products of 2 d), 2.5 times that for the
// backward (five products). Our backward recomputes Q K^T in both passes (seven products),
// so its hardware rate is 7/5 of the printed one.
//
//   build/tests/bench/dhelix_attention_bench [--seq 4096] [--heads 32] [--kv-heads 8]
//       [--head-dim 128] [--batch 1] [--cp 2] [--reps 20]

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/kernels/context_parallel.h"

namespace {

using dhelix::cuda::bf16;
using dhelix::kernels::AttentionShape;

struct Options {
  int64_t batch = 1, seq = 4096, heads = 32, kv_heads = 8, head_dim = 128, cp = 2, reps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::strtoll(argv[i + 1], nullptr, 10);
    if (flag == "--seq")
      o.seq = value;
    else if (flag == "--heads")
      o.heads = value;
    else if (flag == "--kv-heads")
      o.kv_heads = value;
    else if (flag == "--head-dim")
      o.head_dim = value;
    else if (flag == "--batch")
      o.batch = value;
    else if (flag == "--cp")
      o.cp = value;
    else if (flag == "--reps")
      o.reps = value;
    else {
      std::fprintf(stderr, "dhelix_attention_bench: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Device buffer of `count` elements, zero-filled; freed at exit of the process.
template <class T>
T* device(int64_t count) {
  T* p = nullptr;
  DHELIX_CUDA(cudaMalloc(&p, static_cast<size_t>(count) * sizeof(T)));
  DHELIX_CUDA(cudaMemset(p, 0, static_cast<size_t>(count) * sizeof(T)));
  return p;
}

// Small bf16 values (0x3c00 is 2^-7): scores stay moderate, nothing overflows.
bf16* filled(int64_t count) {
  bf16* p = device<bf16>(count);
  DHELIX_CUDA(cudaMemset(p, 0x3c, static_cast<size_t>(count) * sizeof(bf16)));
  return p;
}

// Mean milliseconds of `run` over reps launches after 3 warm-up ones.
double time_ms(int64_t reps, const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t start, stop;
  DHELIX_CUDA(cudaEventCreate(&start));
  DHELIX_CUDA(cudaEventCreate(&stop));
  DHELIX_CUDA(cudaEventRecord(start));
  for (int64_t i = 0; i < reps; ++i) run();
  DHELIX_CUDA(cudaEventRecord(stop));
  DHELIX_CUDA(cudaEventSynchronize(stop));
  float ms = 0.0f;
  DHELIX_CUDA(cudaEventElapsedTime(&ms, start, stop));
  return ms / static_cast<double>(reps);
}

void report(const char* what, const AttentionShape& s, double pairs, double factor, double ms) {
  const double flops = factor * 4.0 * static_cast<double>(s.head_dim) * pairs *
                       static_cast<double>(s.heads * s.batch);
  std::printf("%-22s b%ld s%ld h%ld/%ld d%ld  %9.3f ms  %7.1f TFLOP/s\n", what,
              static_cast<long>(s.batch), static_cast<long>(s.seq), static_cast<long>(s.heads),
              static_cast<long>(s.kv_heads), static_cast<long>(s.head_dim), ms,
              flops / (ms * 1e-3) / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("dhelix_attention_bench: no GPU, nothing timed\n");
    return 0;
  }
  cudaDeviceProp prop{};
  DHELIX_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);

  // Plain causal attention.
  const AttentionShape s{o.batch, o.seq, o.heads, o.kv_heads, o.head_dim};
  const int64_t qn = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kn = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  bf16 *q = filled(qn), *k = filled(kn), *v = filled(kn), *dout = filled(qn);
  bf16 *out = device<bf16>(qn), *dq = device<bf16>(qn), *dk = device<bf16>(kn),
       *dv = device<bf16>(kn);
  float *lse = device<float>(rows), *delta = device<float>(rows);
  const double causal_pairs = static_cast<double>(s.seq) * static_cast<double>(s.seq + 1) / 2.0;
  report("causal forward", s, causal_pairs, 1.0,
         time_ms(o.reps, [&] { dhelix::cuda::attention_forward(s, q, k, v, out, lse, nullptr); }));
  report("causal backward", s, causal_pairs, 2.5, time_ms(o.reps, [&] {
           dhelix::cuda::attention_backward(s, q, k, v, out, lse, dout, dq, dk, dv, delta, nullptr);
         }));

  // One ring step of CP rank 0 visiting the block of rank cp - 1 (its late chunk sees the
  // block's early chunk whole and the late one causally), local sequence seq.
  if (o.cp >= 2 && s.seq % 2 == 0) {
    const int64_t chunk = s.seq / 2;
    const dhelix::cpu::RingStep step{.cp = o.cp, .rank = 0, .block_rank = o.cp - 1, .chunk = chunk};
    double pairs = 0.0;
    for (int64_t i = 0; i < 2 * chunk; ++i) {
      const int64_t position = dhelix::kernels::cp_global_position(o.cp, 0, chunk, i);
      for (int64_t run = 0; run < 2; ++run) {
        pairs += static_cast<double>(dhelix::kernels::visible_keys(
            position, dhelix::kernels::cp_chunk_start(o.cp, o.cp - 1, chunk, run), chunk));
      }
    }
    float* stats = device<float>(dhelix::cuda::ring_state_stats_elements(s));
    float* acc = device<float>(dhelix::cuda::ring_state_acc_elements(s));
    const dhelix::cuda::RingDeviceState state{.stats = stats, .acc = acc};
    dhelix::cuda::ring_forward_start(s, state, nullptr);
    report("ring step forward", s, pairs, 1.0, time_ms(o.reps, [&] {
             dhelix::cuda::ring_forward_step(s, step, q, k, v, state, nullptr);
           }));
    report("ring step backward", s, pairs, 2.5, time_ms(o.reps, [&] {
             dhelix::cuda::ring_backward_step(s, step, q, dout, lse, delta, k, v, dq, dk, dv,
                                              nullptr);
           }));
  }
  DHELIX_CUDA(cudaDeviceSynchronize());
  return 0;
}
