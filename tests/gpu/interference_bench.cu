// dhelix_gpu_interference: how much slower a GEMM runs while a bandwidth-bound kernel holds
// the SMs an NCCL all-gather or reduce-scatter would hold, on one GPU. Not a test: a
// measurement for scripts/gpu-first-light.sh (issue "First light"), printed as JSON lines.
//
// Why this figure: the model prices a kernel beside a collective at the share of SMs the
// collective leaves it (docs/cost-model.md, "Table 7 on the model": NCCL on 24 local or 16
// cross-node CTAs of H100's 132 SMs gives 108/132 = 0.82 and 116/132 = 0.88 of solo speed;
// the model's rate is 0.83-0.87). NCCL moves data with one CTA per channel, each streaming
// through HBM; a grid-stride copy kernel of the same CTA count and thread width takes the
// same SMs and the same kind of HBM traffic, without needing a second rank.
//
// For each CTA count C: the GEMM's solo time, the copy's solo bandwidth, then the GEMM
// timed R times on one stream while the copy (sized to outlast it) runs on another; the
// figure is solo / co-run time, the GEMM's speed as a fraction of solo. A memory-bound
// victim (the same copy kernel on every SM) gives the bandwidth-sharing case.
//
//   dhelix_gpu_interference [--m M --n N --k K] [--ctas 16,24,32] [--reps R] [--mib B]
//
// Exit 77 (ctest's "skipped") with a message when no CUDA device is visible.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "dhelix_gpu_interference: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "dhelix_gpu_interference: %s: cuBLAS status %d\n", what,
               static_cast<int>(status));
  std::exit(1);
}

// Values in [1/32, 1), not zeros: tensor cores multiplying zeros draw less power and hold
// higher clocks (docs/gpu.md, "What the profiler measures").
__global__ void fill(__nv_bfloat16* data, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned hash = static_cast<unsigned>(i) * 2654435761u;
    data[i] = __float2bfloat16(0.03125f + (hash >> 8) * (0.96875f / 16777216.0f));
  }
}

// A grid-stride copy of `words` 16-byte words, `passes` times over.
__global__ void stream_copy(const uint4* source, uint4* target, size_t words, int passes) {
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
      target[i] = source[i];
    }
  }
}

struct Options {
  int m = 8192, n = 4096, k = 14336;  // Llama-3-8B's MLP down projection at sequence 8192
  std::vector<int> ctas = {16, 24, 32};
  int reps = 20;
  size_t mib = 512;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--m")
      o.m = std::atoi(value);
    else if (flag == "--n")
      o.n = std::atoi(value);
    else if (flag == "--k")
      o.k = std::atoi(value);
    else if (flag == "--reps")
      o.reps = std::atoi(value);
    else if (flag == "--mib")
      o.mib = std::strtoull(value, nullptr, 10);
    else if (flag == "--ctas") {
      o.ctas.clear();
      for (const char* p = value; *p != '\0';) {
        o.ctas.push_back(std::atoi(p));
        while (*p != '\0' && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "dhelix_gpu_interference: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (o.m <= 0 || o.n <= 0 || o.k <= 0 || o.reps <= 0 || o.mib == 0 || o.ctas.empty()) {
    std::fprintf(stderr, "dhelix_gpu_interference: sizes, --reps and --ctas must be positive\n");
    std::exit(2);
  }
  return o;
}

class Bench {
 public:
  explicit Bench(const Options& o) : o_(o) {
    check(cudaStreamCreateWithFlags(&gemm_stream_, cudaStreamNonBlocking), "stream");
    check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "stream");
    check(cublasCreate(&handle_), "cublasCreate");
    check(cublasSetStream(handle_, gemm_stream_), "cublasSetStream");
    size_t elements = static_cast<size_t>(o.m) * o.k + static_cast<size_t>(o.k) * o.n +
                      static_cast<size_t>(o.m) * o.n;
    check(cudaMalloc(&operands_, elements * sizeof(__nv_bfloat16)), "cudaMalloc operands");
    fill<<<1024, 256>>>(operands_, elements);
    words_ = o.mib * 1024 * 1024 / sizeof(uint4);
    check(cudaMalloc(&copy_source_, words_ * sizeof(uint4)), "cudaMalloc copy");
    check(cudaMalloc(&copy_target_, words_ * sizeof(uint4)), "cudaMalloc copy");
    check(cudaMemset(copy_source_, 1, words_ * sizeof(uint4)), "cudaMemset");
    check(cudaEventCreate(&start_), "event");
    check(cudaEventCreate(&stop_), "event");
    check(cudaDeviceSynchronize(), "fill");
  }

  // Milliseconds of `reps` GEMMs on the GEMM stream.
  float gemms(int reps) {
    const float alpha = 1.0f, beta = 0.0f;
    const __nv_bfloat16* a = operands_;
    const __nv_bfloat16* b = a + static_cast<size_t>(o_.m) * o_.k;
    __nv_bfloat16* c =
        operands_ + static_cast<size_t>(o_.m) * o_.k + static_cast<size_t>(o_.k) * o_.n;
    check(cudaEventRecord(start_, gemm_stream_), "record");
    for (int r = 0; r < reps; ++r) {
      check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, o_.m, o_.n, o_.k, &alpha, a,
                         CUDA_R_16BF, o_.m, b, CUDA_R_16BF, o_.k, &beta, c, CUDA_R_16BF, o_.m,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    }
    return elapsed(gemm_stream_);
  }

  // One copy of `ctas` CTAs of 512 threads over the buffer, `passes` times, on `stream`.
  void launch_copy(int ctas, int passes, cudaStream_t stream) {
    stream_copy<<<ctas, 512, 0, stream>>>(copy_source_, copy_target_, words_, passes);
    check(cudaGetLastError(), "stream_copy launch");
  }
  // Milliseconds of such a copy on the copy stream.
  float copy(int ctas, int passes) {
    check(cudaEventRecord(start_, copy_stream_), "record");
    launch_copy(ctas, passes, copy_stream_);
    return elapsed(copy_stream_);
  }
  double copy_gbps(int ctas) {
    copy(ctas, 1);
    return 2.0 * words_ * sizeof(uint4) / (copy(ctas, 2) / 2 * 1e-3) / 1e9;
  }

  // The GEMMs' milliseconds while a copy of `ctas` CTAs, sized to outlast them, runs beside.
  float gemms_beside_copy(int ctas, float solo_ms) {
    float pass_ms = copy(ctas, 1);
    int passes = static_cast<int>(2.0f * solo_ms / pass_ms) + 2;
    launch_copy(ctas, passes, copy_stream_);
    float ms = gemms(o_.reps);
    check(cudaStreamSynchronize(copy_stream_), "copy");
    return ms;
  }

  // The copy on every SM as the victim, beside a copy of `ctas` CTAs: bandwidth sharing.
  float copy_beside_copy(int all_ctas, int ctas) {
    float victim_ms = copy(all_ctas, 1);
    launch_copy(ctas, 4, gemm_stream_);
    float ms = copy(all_ctas, 1);
    check(cudaDeviceSynchronize(), "copy pair");
    return victim_ms / ms;
  }

 private:
  float elapsed(cudaStream_t stream) {
    check(cudaEventRecord(stop_, stream), "record");
    check(cudaEventSynchronize(stop_), "synchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    return ms;
  }

  Options o_;
  cudaStream_t gemm_stream_{}, copy_stream_{};
  cublasHandle_t handle_{};
  __nv_bfloat16* operands_ = nullptr;
  uint4 *copy_source_ = nullptr, *copy_target_ = nullptr;
  size_t words_ = 0;
  cudaEvent_t start_{}, stop_{};
};

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("dhelix_gpu_interference: no CUDA device (%s): nothing measured\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  Bench bench(options);
  bench.gemms(3);  // warm-up: cuBLAS picks and loads its kernel
  float solo_ms = bench.gemms(options.reps);
  double tflops = 2.0 * options.m * options.n * options.k * options.reps / (solo_ms * 1e-3) / 1e12;
  std::printf(
      "{\"device\": \"%s\", \"sms\": %d, \"gemm\": \"m=%d,n=%d,k=%d\", \"gemm_solo_us\": %.1f, "
      "\"gemm_solo_tflops\": %.1f, \"copy_all_sms_gbps\": %.0f}\n",
      prop.name, prop.multiProcessorCount, options.m, options.n, options.k,
      1e3 * solo_ms / options.reps, tflops, bench.copy_gbps(prop.multiProcessorCount));
  for (int ctas : options.ctas) {
    float corun_ms = bench.gemms_beside_copy(ctas, solo_ms);
    std::printf(
        "{\"copy_ctas\": %d, \"copy_solo_gbps\": %.0f, \"gemm_corun_us\": %.1f, "
        "\"gemm_speed_fraction\": %.3f, \"sm_share_left\": %.3f, "
        "\"membound_speed_fraction\": %.3f}\n",
        ctas, bench.copy_gbps(ctas), 1e3 * corun_ms / options.reps, solo_ms / corun_ms,
        1.0 - static_cast<double>(ctas) / prop.multiProcessorCount,
        bench.copy_beside_copy(prop.multiProcessorCount, ctas));
    std::fflush(stdout);
  }
  return 0;
}
