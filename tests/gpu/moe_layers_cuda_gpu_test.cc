// MoeLayersCuda (runtime/cuda/moe_layers_cuda.h): the bound ops of an EP 2 job, both EP
// ranks on one GPU, against MoeLayersCpu with ep = 1 (every expert on one rank; each EP
// rank's tokens as one micro-batch of it: the same model, runtime/model/moe_layers_cpu.h).
// The padded all-to-all is simulated as DeviceCommunicator::all_to_all_v moves it: block j
// of member i's input (count / ep elements) into block i of member j's output, with the
// counts beside. Output, input gradient and the weight gradients (the router's summed over
// the two ranks as the dp sum would; each rank's experts the EP 1 layer's slice) agree
// within 5 % relative L2 (bf16 activations, the bound of cuda_stage_model_gpu_test.cc).
// With a shared expert (runtime/model/moe_shared_expert_padded.h, tp = 1) its ops run after
// the routed experts' in each direction; its weights' gradients are summed over the two
// ranks as the dp sum would.
#include "runtime/cuda/moe_layers_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/rank_shape.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/model/moe_layers_cpu.h"
#include "runtime/model/moe_op_names.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    diff += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

JobSpec moe_job(int64_t ep, int64_t shared_width = 0) {
  JobSpec job = test::tiny_job(/*tp=*/1, /*sp=*/false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 0.75,
                          .expert_ffn_hidden_size = 32,
                          .shared_expert_ffn_hidden_size = shared_width,
                          .aux_loss_coeff = 0.01};
  job.parallel.dp = 2;
  job.parallel.global_batch_size = 4;
  job.parallel.ep = ep;
  return job;
}

// The ops of `names` (runtime/model/moe_op_names.h, in their order) of one direction
// ("fwd." or "bwd."), without the TP exchanges (tp = 1 here).
std::vector<const char*> ops_of(const auto& names, const std::string& direction) {
  std::vector<const char*> ops;
  for (const char* op : names) {
    const std::string name = op;
    if (name.starts_with(direction) && name.find("allgather") == std::string::npos &&
        name.find("reduce_scatter") == std::string::npos) {
      ops.push_back(op);
    }
  }
  return ops;
}

std::vector<float> download(const float* device, int64_t count) {
  std::vector<float> host(to_size(count));
  DHELIX_CUDA(cudaDeviceSynchronize());
  DHELIX_CUDA(cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

// The EP 2 layers (with a shared expert of `shared_width`, 0: none) against the EP 1 CPU layer.
void expect_cpu_layer_within_bf16_error(int64_t shared_width) {
  const int64_t ep = 2, t = 32, h = 64;  // tiny_job: 2 sequences of 16, hidden 64
  const float loss_scale = 1.0f / static_cast<float>(t);
  const JobSpec job = moe_job(ep, shared_width), reference_job = moe_job(1, shared_width);
  cudaStream_t stream = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    CublasGemm gemm(stream);
    DevicePool pool(stream);
    CudaBackend::Memory memory(CudaBackend::MemoryConfig{&pool});
    // The router's scratch (moe_route_workspace_bytes) on the stream's workspace.
    const int64_t workspace_bytes = moe_route_workspace_bytes(t, 2, 4);
    DeviceBuffer<char> workspace(workspace_bytes);
    const CudaBackend::Exec exec{.stream = stream,
                                 .gemm = &gemm,
                                 .workspace = {workspace.get(), workspace_bytes},
                                 .cudnn = nullptr};
    std::vector<std::unique_ptr<MoeLayersCuda>> gpu;
    for (int64_t r = 0; r < ep; ++r) {
      gpu.push_back(
          std::make_unique<MoeLayersCuda>(job, r, std::vector<int64_t>{0}, 7, &loss_scale, memory));
    }
    rt::MoeLayersCpu cpu(reference_job, 0, {0}, 7, &loss_scale);
    memory.synchronize();

    // Inputs per EP rank; the CPU runs rank r's tokens as its micro-batch r.
    std::vector<std::vector<float>> x(ep), dy(ep), y(ep, std::vector<float>(to_size(t * h))),
        dx(ep, std::vector<float>(to_size(t * h)));
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> d_x, d_dy, d_y, d_dx;
    std::vector<MoeDeviceLayerIo> io;
    for (int64_t r = 0; r < ep; ++r) {
      x[to_size(r)] = bf16_rounded(random_floats(t * h, static_cast<uint32_t>(1 + r)));
      dy[to_size(r)] = bf16_rounded(random_floats(t * h, static_cast<uint32_t>(11 + r)));
      d_x.push_back(std::make_unique<DeviceBuffer<bf16>>(to_bf16(x[to_size(r)])));
      d_dy.push_back(std::make_unique<DeviceBuffer<bf16>>(to_bf16(dy[to_size(r)])));
      d_y.push_back(std::make_unique<DeviceBuffer<bf16>>(t * h));
      d_dx.push_back(std::make_unique<DeviceBuffer<bf16>>(t * h));
      io.push_back({d_x.back()->get(), d_y.back()->get(), d_dy.back()->get(), d_dx.back()->get()});
    }
    auto run_gpu = [&](const char* op) {
      std::vector<MoeLayersCuda::BoundOp> bound;
      for (int64_t r = 0; r < ep; ++r) {
        std::optional<MoeLayersCuda::BoundOp> b = gpu[to_size(r)]->bind(op, 0, 0, io[to_size(r)]);
        ASSERT_TRUE(b.has_value()) << op;
        bound.push_back(std::move(*b));
      }
      if (bound[0].compute) {
        for (auto& b : bound) b.compute(exec);
        return;
      }
      // The padded all-to-all: block j of member i -> block i of member j.
      DHELIX_CUDA(cudaStreamSynchronize(stream));
      for (int64_t i = 0; i < ep; ++i) {
        const rt::CollectiveRequest& from = *bound[to_size(i)].collective;
        const int64_t block = from.count / ep;
        for (int64_t j = 0; j < ep; ++j) {
          const rt::CollectiveRequest& to = *bound[to_size(j)].collective;
          DHELIX_CUDA(cudaMemcpy(static_cast<bf16*>(to.out) + i * block,
                                 static_cast<const bf16*>(from.in) + j * block,
                                 to_size(block) * sizeof(bf16), cudaMemcpyDeviceToDevice));
          DHELIX_CUDA(cudaMemcpy(to.recv_counts + i * from.chunks,
                                 from.send_counts + j * from.chunks,
                                 to_size(from.chunks) * sizeof(int64_t), cudaMemcpyDeviceToDevice));
        }
      }
      for (auto& b : bound) {
        if (b.after_collective) b.after_collective(exec);
      }
    };
    auto run_cpu = [&](const char* op) {
      for (int64_t r = 0; r < ep; ++r) {
        const rt::MoeLayerIo cio{.x = x[to_size(r)].data(),
                                 .y = y[to_size(r)].data(),
                                 .dy = dy[to_size(r)].data(),
                                 .dx = dx[to_size(r)].data()};
        std::optional<rt::BoundOp> b = cpu.bind(op, 0, r, cio);
        ASSERT_TRUE(b.has_value()) << op;
        b->compute(rt::CpuBackend::Exec{});
      }
    };
    auto run = [&](const auto& ops) {
      for (const char* op : ops) {
        run_gpu(op);
        if (!std::string(op).ends_with("_a2a")) run_cpu(op);
      }
    };
    run(ops_of(rt::kRoutedMoeOps, "fwd."));
    if (shared_width > 0) run(ops_of(rt::kSharedOps, "fwd."));  // y += g shared(x), after y
    run(ops_of(rt::kRoutedMoeOps, "bwd."));
    if (shared_width > 0) run(ops_of(rt::kSharedOps, "bwd."));
    for (int64_t r = 0; r < ep; ++r) {
      gpu[to_size(r)]->sum_input_gradient(0, 0, io[to_size(r)])(exec);
      const rt::MoeLayerIo cio{.x = x[to_size(r)].data(),
                               .y = y[to_size(r)].data(),
                               .dy = dy[to_size(r)].data(),
                               .dx = dx[to_size(r)].data()};
      cpu.sum_input_gradient(0, r, cio)(rt::CpuBackend::Exec{});
    }
    DHELIX_CUDA(cudaStreamSynchronize(stream));
    ASSERT_GT(cpu.dropped_copies(), 0) << "capacity factor 0.75 should drop copies";
    EXPECT_EQ(gpu[0]->dropped_copies() + gpu[1]->dropped_copies(), cpu.dropped_copies());
    EXPECT_NEAR(gpu[0]->aux_loss_sum(1) + gpu[1]->aux_loss_sum(1), cpu.aux_loss_sum(2),
                1e-2 * std::abs(cpu.aux_loss_sum(2)));
    for (int64_t r = 0; r < ep; ++r) {
      SCOPED_TRACE(::testing::Message() << "EP rank " << r);
      EXPECT_LT(relative_l2(to_f32(d_y[to_size(r)]->download()), y[to_size(r)]), 0.05);
      EXPECT_LT(relative_l2(to_f32(d_dx[to_size(r)]->download()), dx[to_size(r)]), 0.05);
    }
    // Gradients: the router's (and the shared expert's) summed over the ranks; rank r's
    // experts are the slice [r L, (r + 1) L) of the EP 1 layer's.
    const std::vector<rt::ParameterView> reference = cpu.parameters(0);
    const std::vector<size_t> dense =
        shared_width > 0 ? std::vector<size_t>{0, 3, 4, 5} : std::vector<size_t>{0};
    ASSERT_EQ(reference.size(), shared_width > 0 ? 6u : 3u);
    std::vector<std::vector<float>> dense_sum;
    for (size_t p : dense) dense_sum.emplace_back(to_size(reference[p].count), 0.0f);
    for (int64_t r = 0; r < ep; ++r) {
      const std::vector<MoeLayersCuda::ParameterView> views = gpu[to_size(r)]->parameters(0);
      ASSERT_EQ(views.size(), reference.size());
      EXPECT_FALSE(views[0].expert);
      EXPECT_TRUE(views[1].expert && views[2].expert);
      for (size_t d = 0; d < dense.size(); ++d) {
        const rt::ParameterView& want = reference[dense[d]];
        const MoeLayersCuda::ParameterView& got = views[dense[d]];
        EXPECT_EQ(got.name, want.name);
        EXPECT_EQ(got.expert, want.expert) << got.name;
        EXPECT_EQ(got.sum_gradient_over_tp, want.sum_gradient_over_tp) << got.name;
        ASSERT_EQ(got.count, want.count) << got.name;
        const std::vector<float> gradient = download(got.gradient, got.count);
        for (size_t i = 0; i < gradient.size(); ++i) dense_sum[d][i] += gradient[i];
        // The same initial values as the CPU's (the GPU's master copy is fp32).
        EXPECT_EQ(download(got.values, got.count),
                  std::vector<float>(want.values, want.values + want.count))
            << got.name;
      }
      for (size_t p = 1; p < 3; ++p) {
        const int64_t n = views[p].count;
        ASSERT_EQ(n * ep, reference[p].count);
        const std::vector<float> want(reference[p].gradient + r * n,
                                      reference[p].gradient + (r + 1) * n);
        EXPECT_LT(relative_l2(download(views[p].gradient, n), want), 0.05) << views[p].name;
      }
    }
    for (size_t d = 0; d < dense.size(); ++d) {
      const rt::ParameterView& want = reference[dense[d]];
      EXPECT_LT(
          relative_l2(dense_sum[d], std::vector<float>(want.gradient, want.gradient + want.count)),
          0.05)
          << want.name;
    }
    DHELIX_CUDA(cudaStreamSynchronize(stream));
  }
  DHELIX_CUDA(cudaStreamDestroy(stream));
}

TEST(MoeLayersCuda, ExpertParallelOpsMatchTheCpuLayerWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  expect_cpu_layer_within_bf16_error(0);
}

TEST(MoeLayersCuda, ASharedExpertMatchesTheCpuLayerWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  expect_cpu_layer_within_bf16_error(32);
}

TEST(MoeLayersCuda, DroplessRoutingPadsToTheRanksRows) {
  DHELIX_REQUIRE_GPUS(1);
  cudaStream_t stream = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DevicePool pool(stream);
    CudaBackend::Memory memory(CudaBackend::MemoryConfig{&pool});
    const float scale = 1.0f;
    JobSpec dropless = moe_job(2);
    dropless.model.moe->capacity_factor = 0.0;
    MoeLayersCuda layers(dropless, 0, {0}, 7, &scale, memory);
    EXPECT_EQ(layers.capacity(), rank_shape(dropless, 0).rows);  // C = T: nothing drops
  }
  DHELIX_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace dhelix::cuda
