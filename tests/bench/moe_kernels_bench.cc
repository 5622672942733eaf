// The MoE and embedding kernels' speed on one GPU (not a test; docs/gpu.md, "MoE and
// embedding kernels"): each kernel family's time per call (CUDA events, the mean of
// --reps calls after 3 warm-up calls) and its effective bandwidth, the bytes it must move
// at least (below, per family) over that time. Exit 77 with "no GPU" on a machine
// without a device, as the gpu-labelled tests skip.
//
//   build/tests/bench/dhelix_moe_kernels_bench [--tokens 8192] [--hidden 4096]
//       [--experts 8] [--top-k 2] [--cf 1.0] [--vocab 32000] [--reps 20]
//
// Bytes counted (bf16 activations 2 bytes, fp32 4, T tokens, h hidden, E experts, k,
// capacity C, V the embedding shard's rows):
//   route               logits T E 2 read, probs T E 4 written and read back by the aux
//                       loss, chosen, gate, kept, row T k (4 + 4 + 1 + 8)
//   permute             the padded buffer E C h 2 zeroed and T k h 2 rows copied in
//   unpermute           T k h 2 read, T h 2 written
//   unpermute backward  E C h 2 zeroed, T k h 2 written, dgate: 2 T k h 2 read
//   permute backward    T k h 2 read, T h 2 written
//   router backward     probs T E 4 read, dz T E 2 written
//   shared gate bwd     dy, out T h 2 each read, d_out T h 2 written
//   embedding backward  dout T h 2 read, each touched table row h 4 read and written
// A memory-bound kernel should reach 50-80 % of the HBM bandwidth (H100 SXM: 3.35 TB/s)
// at these sizes; the router's launches are latency-bound (about 10 us each at most).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/cuda/moe_shared_cuda.h"
#include "runtime/kernels/moe_capacity.h"

namespace dhelix::cuda {
namespace {

struct Options {
  int64_t tokens = 8192, hidden = 4096, experts = 8, top_k = 2, vocab = 32000, reps = 20;
  double cf = 1.0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--tokens")
      o.tokens = std::atoll(value);
    else if (flag == "--hidden")
      o.hidden = std::atoll(value);
    else if (flag == "--experts")
      o.experts = std::atoll(value);
    else if (flag == "--top-k")
      o.top_k = std::atoll(value);
    else if (flag == "--vocab")
      o.vocab = std::atoll(value);
    else if (flag == "--reps")
      o.reps = std::atoll(value);
    else if (flag == "--cf")
      o.cf = std::atof(value);
    else {
      std::fprintf(stderr, "dhelix_moe_kernels_bench: unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  return o;
}

// Device memory of `bytes`, filled with a pattern (bf16 values near 0.01 when read as
// bf16: 0x3c23), freed at exit.
void* device_bytes(int64_t bytes) {
  void* p = nullptr;
  DHELIX_CUDA(cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1)));
  DHELIX_CUDA(cudaMemset(p, 0x3c, static_cast<size_t>(bytes)));
  return p;
}
template <class T>
T* device(int64_t count) {
  return static_cast<T*>(device_bytes(count * static_cast<int64_t>(sizeof(T))));
}

// Mean milliseconds of `reps` calls of fn after 3 warm-up calls.
double time_ms(int64_t reps, cudaStream_t stream, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start = nullptr, stop = nullptr;
  DHELIX_CUDA(cudaEventCreate(&start));
  DHELIX_CUDA(cudaEventCreate(&stop));
  DHELIX_CUDA(cudaEventRecord(start, stream));
  for (int64_t i = 0; i < reps; ++i) fn();
  DHELIX_CUDA(cudaEventRecord(stop, stream));
  DHELIX_CUDA(cudaEventSynchronize(stop));
  float ms = 0.0f;
  DHELIX_CUDA(cudaEventElapsedTime(&ms, start, stop));
  DHELIX_CUDA(cudaEventDestroy(start));
  DHELIX_CUDA(cudaEventDestroy(stop));
  return static_cast<double>(ms) / static_cast<double>(reps);
}

void report(const char* family, double ms, double bytes) {
  std::printf("%-20s %10.1f us %10.1f GB/s\n", family, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

int run(const Options& o) {
  cudaStream_t stream = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t t = o.tokens, h = o.hidden, e = o.experts, k = o.top_k, n = t * k;
  const MoeDeviceShape s{.tokens = t,
                         .hidden = h,
                         .experts = e,
                         .top_k = k,
                         .capacity = kernels::expert_capacity(t, k, e, o.cf),
                         .aux_loss_coeff = 0.01};
  const int64_t rows = s.experts * s.capacity;
  // Random logits, so that the routing is a real one (with dropping at cf 1).
  std::vector<uint16_t> logits_host(static_cast<size_t>(t * e));
  std::mt19937 engine(1);
  for (uint16_t& v : logits_host) v = static_cast<uint16_t>(0x3f80 + engine() % 0x7f);
  auto* logits = device<bf16>(t * e);
  DHELIX_CUDA(
      cudaMemcpy(logits, logits_host.data(), logits_host.size() * 2, cudaMemcpyHostToDevice));
  const MoeDeviceRouting r{.chosen = device<int32_t>(n),
                           .gate = device<float>(n),
                           .probs = device<float>(t * e),
                           .kept = device<uint8_t>(n),
                           .row = device<int64_t>(n),
                           .routed = device<int64_t>(e),
                           .send_counts = device<int64_t>(e),
                           .aux_loss = device<float>(1)};
  const int64_t ws_bytes =
      std::max(moe_route_workspace_bytes(t, k, e), embedding_backward_workspace_bytes(t));
  const Workspace ws{device_bytes(ws_bytes), ws_bytes};
  auto* x = device<bf16>(t * h);
  auto* y = device<bf16>(t * h);
  auto* permuted = device<bf16>(rows * h);
  auto* expert_out = device<bf16>(rows * h);
  auto* dgate = device<float>(n);
  auto* dz = device<bf16>(t * e);
  auto* gate = device<float>(t);
  auto* d_logit = device<bf16>(t);
  auto* d_out = device<bf16>(t * h);
  auto* dtable = device<float>(o.vocab * h);
  std::vector<int64_t> tokens_host(static_cast<size_t>(t));
  std::set<int64_t> distinct;
  for (int64_t& token : tokens_host)
    distinct.insert(token = static_cast<int64_t>(engine() % o.vocab));
  auto* tokens = device<int64_t>(t);
  DHELIX_CUDA(
      cudaMemcpy(tokens, tokens_host.data(), tokens_host.size() * 8, cudaMemcpyHostToDevice));
  DHELIX_CUDA(cudaMemset(gate, 0, static_cast<size_t>(t) * 4));

  std::printf("T %lld  h %lld  E %lld  k %lld  C %lld  V %lld  (%lld reps)\n",
              static_cast<long long>(t), static_cast<long long>(h), static_cast<long long>(e),
              static_cast<long long>(k), static_cast<long long>(s.capacity),
              static_cast<long long>(o.vocab), static_cast<long long>(o.reps));
  std::printf("%-20s %13s %15s\n", "family", "time", "effective");
  const double tk = static_cast<double>(n), th = static_cast<double>(t * h);
  const double tkh2 = tk * static_cast<double>(h) * 2, padded2 = static_cast<double>(rows * h) * 2;
  report("route", time_ms(o.reps, stream, [&] { moe_route(s, logits, r, ws, stream); }),
         static_cast<double>(t * e) * (2 + 4 + 4) + tk * 17);
  report("permute", time_ms(o.reps, stream, [&] { moe_permute(s, r, x, permuted, stream); }),
         padded2 + tkh2);
  report("unpermute", time_ms(o.reps, stream, [&] { moe_unpermute(s, r, expert_out, y, stream); }),
         tkh2 + th * 2);
  report("unpermute backward",
         time_ms(o.reps, stream,
                 [&] { moe_unpermute_backward(s, r, y, expert_out, permuted, dgate, stream); }),
         padded2 + 3 * tkh2);
  report("permute backward",
         time_ms(o.reps, stream, [&] { moe_permute_backward(s, r, permuted, y, stream); }),
         tkh2 + th * 2);
  report(
      "router backward",
      time_ms(o.reps, stream, [&] { moe_router_logits_backward(s, r, dgate, 1.0f, dz, stream); }),
      static_cast<double>(t * e) * 6);
  report("shared gate bwd",
         time_ms(o.reps, stream,
                 [&] { moe_shared_gate_backward(t, h, gate, y, x, d_logit, d_out, stream); }),
         th * 6);
  report("embedding backward",
         time_ms(o.reps, stream,
                 [&] { embedding_backward(t, h, tokens, x, 0, o.vocab, dtable, ws, stream); }),
         th * 2 + static_cast<double>(distinct.size()) * static_cast<double>(h) * 8);
  DHELIX_CUDA(cudaStreamSynchronize(stream));
  return 0;
}

}  // namespace
}  // namespace dhelix::cuda

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("dhelix_moe_kernels_bench: no GPU: nothing measured\n");
    return 77;
  }
  return dhelix::cuda::run(dhelix::cuda::parse(argc, argv));
}
