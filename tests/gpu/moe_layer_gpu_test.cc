// A whole MoE layer with expert parallelism 2 on one GPU, from the kernels of
// runtime/cuda/moe_cuda.h and the cuBLAS wrapper on the padded shapes (ep C rows per local
// expert), against the CPU layer (runtime/cpu/moe_cpu.h, every expert local): the two EP
// ranks' dispatch and combine are the device copies the padded all-to-all makes
// (DeviceCommunicator::all_to_all_v: block j of member i goes to block i of member j).
// Forward output, the input gradient, dgate and the experts' weight gradients (summed over
// both ranks' tokens, as the expert-data-parallel sum would) agree within the relative L2
// bound of cuda_stage_model_gpu_test.cc (5 %; bf16 activations, docs/kernels.md). The
// padding rows are what makes the shapes fixed: that they add nothing is what this checks.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cpu/moe_cpu.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

constexpr int64_t kEp = 2, kTokens = 32, kHidden = 16, kExperts = 4, kTopK = 2, kFfn = 8;
constexpr int64_t kLocal = kExperts / kEp;
constexpr double kCf = 0.75;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * static_cast<double>(actual[i] - expected[i]);
    norm += expected[i] * static_cast<double>(expected[i]);
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Device buffers of one EP rank.
struct Rank {
  DeviceBuffer<int32_t> chosen{kTokens * kTopK};
  DeviceBuffer<float> gate{kTokens * kTopK}, probs{kTokens * kExperts}, aux{1};
  DeviceBuffer<float> dgate{kTokens * kTopK};
  DeviceBuffer<uint8_t> kept{kTokens * kTopK};
  DeviceBuffer<int64_t> row{kTokens * kTopK}, routed{kExperts}, counts{kExperts};
  std::unique_ptr<DeviceBuffer<bf16>> x, dy, logits, y, dx;
  // [E C, h] in the rank's layout; [ep L C, h] for its local experts.
  std::unique_ptr<DeviceBuffer<bf16>> permuted, received, expert_in, fc1_out, act, expert_out,
      out_src, combined, d_combined, d_received, d_out, d_act, d_fc1, d_in, d_in_src, d_permuted;
  MoeDeviceRouting view() const {
    return {.chosen = chosen.get(),
            .gate = gate.get(),
            .probs = probs.get(),
            .kept = kept.get(),
            .row = row.get(),
            .routed = routed.get(),
            .send_counts = counts.get(),
            .aux_loss = aux.get()};
  }
};

// The padded all-to-all on one GPU: block j of from[i] goes to block i of to[j].
void exchange(std::vector<Rank>& ranks, std::unique_ptr<DeviceBuffer<bf16>> Rank::*from,
              std::unique_ptr<DeviceBuffer<bf16>> Rank::*to, int64_t block_elements) {
  const size_t bytes = to_size(block_elements) * sizeof(bf16);
  for (int64_t i = 0; i < kEp; ++i) {
    for (int64_t j = 0; j < kEp; ++j) {
      DHELIX_CUDA(cudaMemcpy((ranks[to_size(j)].*to)->get() + i * block_elements,
                             (ranks[to_size(i)].*from)->get() + j * block_elements, bytes,
                             cudaMemcpyDeviceToDevice));
    }
  }
}

TEST(CudaMoeLayer, ExpertParallelLayerMatchesTheCpuWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t capacity = kernels::expert_capacity(kTokens, kTopK, kExperts, kCf);
  const int64_t rows = kernels::padded_rows(kExperts, capacity);  // per rank, and arriving
  const int64_t per_expert = kEp * capacity, h = kHidden, f = kFfn;
  const MoeDeviceShape shape{.tokens = kTokens,
                             .hidden = kHidden,
                             .experts = kExperts,
                             .top_k = kTopK,
                             .capacity = capacity,
                             .aux_loss_coeff = 0.01};
  const cpu::MoeLayerShape cpu_shape{.tokens = kTokens,
                                     .hidden = kHidden,
                                     .experts = kExperts,
                                     .top_k = kTopK,
                                     .ffn = kFfn,
                                     .capacity_factor = kCf,
                                     .aux_loss_coeff = 0.01};
  const std::vector<float> fc1 = bf16_rounded(random_floats(kExperts * 2 * f * h, 1, -0.5f, 0.5f));
  const std::vector<float> fc2 = bf16_rounded(random_floats(kExperts * h * f, 2, -0.5f, 0.5f));
  DeviceBuffer<bf16> w1(to_bf16(fc1)), w2(to_bf16(fc2));
  DeviceBuffer<float> dw1(kExperts * 2 * f * h), dw2(kExperts * h * f);
  DHELIX_CUDA(cudaMemset(dw1.get(), 0, to_size(kExperts * 2 * f * h) * sizeof(float)));
  DHELIX_CUDA(cudaMemset(dw2.get(), 0, to_size(kExperts * h * f) * sizeof(float)));
  std::vector<float> cpu_dw1(fc1.size(), 0.0f), cpu_dw2(fc2.size(), 0.0f);
  CublasGemm gemm(nullptr);

  std::vector<Rank> ranks(kEp);
  std::vector<cpu::MoeRouting> routing(kEp);
  std::vector<std::vector<float>> x(kEp), dy(kEp), cpu_y(kEp), cpu_dx(kEp), cpu_dgate(kEp);
  auto buffer = [](int64_t n) { return std::make_unique<DeviceBuffer<bf16>>(n); };
  for (int64_t r = 0; r < kEp; ++r) {
    Rank& rank = ranks[to_size(r)];
    const auto seed = static_cast<uint32_t>(10 * r);
    x[to_size(r)] = bf16_rounded(random_floats(kTokens * h, seed + 1));
    dy[to_size(r)] = bf16_rounded(random_floats(kTokens * h, seed + 2));
    routing[to_size(r)].logits = bf16_rounded(random_floats(kTokens * kExperts, seed + 3, -2, 2));
    rank.x = std::make_unique<DeviceBuffer<bf16>>(to_bf16(x[to_size(r)]));
    rank.dy = std::make_unique<DeviceBuffer<bf16>>(to_bf16(dy[to_size(r)]));
    rank.logits = std::make_unique<DeviceBuffer<bf16>>(to_bf16(routing[to_size(r)].logits));
    rank.y = buffer(kTokens * h);
    rank.dx = buffer(kTokens * h);
    for (auto* b : {&rank.permuted, &rank.received, &rank.expert_in, &rank.expert_out,
                    &rank.out_src, &rank.combined, &rank.d_combined, &rank.d_received, &rank.d_out,
                    &rank.d_in, &rank.d_in_src, &rank.d_permuted}) {
      *b = buffer(rows * h);
    }
    rank.fc1_out = buffer(rows * 2 * f);
    rank.d_fc1 = buffer(rows * 2 * f);
    rank.act = buffer(rows * f);
    rank.d_act = buffer(rows * f);

    // The CPU reference: one rank with every expert local.
    cpu::MoeRouting& cr = routing[to_size(r)];
    cpu::moe_route_logits(cpu_shape, cr);
    const auto slots = to_size(cr.slots());
    std::vector<float> permuted(slots * h), fc1_out(slots * 2 * f), act(slots * f), out(slots * h),
        d_out(slots * h), d_in(slots * h);
    cpu_y[to_size(r)].resize(to_size(kTokens * h));
    cpu_dx[to_size(r)].resize(to_size(kTokens * h));
    cpu_dgate[to_size(r)].resize(to_size(kTokens * kTopK));
    cpu::moe_permute(cpu_shape, cr, x[to_size(r)].data(), permuted.data());
    cpu::moe_experts_forward(cpu_shape, cr.expert_rows, permuted.data(), fc1.data(), fc2.data(),
                             fc1_out.data(), act.data(), out.data());
    cpu::moe_unpermute(cpu_shape, cr, out.data(), cpu_y[to_size(r)].data());
    cpu::moe_unpermute_backward(cpu_shape, cr, dy[to_size(r)].data(), out.data(), d_out.data(),
                                cpu_dgate[to_size(r)].data());
    cpu::moe_experts_backward(cpu_shape, cr.expert_rows, permuted.data(), fc1.data(), fc2.data(),
                              fc1_out.data(), act.data(), d_out.data(), d_in.data(), cpu_dw1.data(),
                              cpu_dw2.data());
    cpu::moe_permute_backward(cpu_shape, cr, d_in.data(), cpu_dx[to_size(r)].data());
  }
  ASSERT_GT(routing[0].dropped + routing[1].dropped, 0) << "the test should drop assignments";

  const int64_t block = kLocal * capacity * h;  // elements one rank sends each member
  // Forward: route and permute on every rank, dispatch, experts, combine, unpermute.
  const int64_t workspace_bytes =
      moe_route_workspace_bytes(shape.tokens, shape.top_k, shape.experts);
  DeviceBuffer<char> workspace(workspace_bytes);
  for (Rank& rank : ranks) {
    moe_route(shape, rank.logits->get(), rank.view(), {workspace.get(), workspace_bytes}, nullptr);
    moe_permute(shape, rank.view(), rank.x->get(), rank.permuted->get(), nullptr);
  }
  DHELIX_CUDA(cudaDeviceSynchronize());
  exchange(ranks, &Rank::permuted, &Rank::received, block);
  for (int64_t j = 0; j < kEp; ++j) {
    Rank& rank = ranks[to_size(j)];
    moe_regroup(kEp, kLocal, capacity, h, rank.received->get(), rank.expert_in->get(), true,
                nullptr);
    for (int64_t e = 0; e < kLocal; ++e) {
      const int64_t global = j * kLocal + e, first = e * per_expert;
      gemm.linear_forward(per_expert, h, 2 * f, rank.expert_in->get() + first * h,
                          w1.get() + global * 2 * f * h, rank.fc1_out->get() + first * 2 * f);
    }
    swiglu_forward(rows, f, rank.fc1_out->get(), rank.act->get(), nullptr);
    for (int64_t e = 0; e < kLocal; ++e) {
      const int64_t global = j * kLocal + e, first = e * per_expert;
      gemm.linear_forward(per_expert, f, h, rank.act->get() + first * f, w2.get() + global * h * f,
                          rank.expert_out->get() + first * h);
    }
    moe_regroup(kEp, kLocal, capacity, h, rank.expert_out->get(), rank.out_src->get(), false,
                nullptr);
  }
  DHELIX_CUDA(cudaDeviceSynchronize());
  exchange(ranks, &Rank::out_src, &Rank::combined, block);
  for (Rank& rank : ranks) {
    moe_unpermute(shape, rank.view(), rank.combined->get(), rank.y->get(), nullptr);
    moe_unpermute_backward(shape, rank.view(), rank.dy->get(), rank.combined->get(),
                           rank.d_combined->get(), rank.dgate.get(), nullptr);
  }
  // Backward: the combine's reverse, the experts' backward, the dispatch's reverse.
  DHELIX_CUDA(cudaDeviceSynchronize());
  exchange(ranks, &Rank::d_combined, &Rank::d_received, block);
  for (int64_t j = 0; j < kEp; ++j) {
    Rank& rank = ranks[to_size(j)];
    moe_regroup(kEp, kLocal, capacity, h, rank.d_received->get(), rank.d_out->get(), true, nullptr);
    for (int64_t e = 0; e < kLocal; ++e) {
      const int64_t global = j * kLocal + e, first = e * per_expert;
      gemm.linear_dgrad(per_expert, f, h, rank.d_out->get() + first * h, w2.get() + global * h * f,
                        rank.d_act->get() + first * f);
      gemm.linear_wgrad_accumulate(per_expert, f, h, rank.d_out->get() + first * h,
                                   rank.act->get() + first * f, dw2.get() + global * h * f);
    }
    swiglu_backward(rows, f, rank.fc1_out->get(), rank.d_act->get(), rank.d_fc1->get(), nullptr);
    for (int64_t e = 0; e < kLocal; ++e) {
      const int64_t global = j * kLocal + e, first = e * per_expert;
      gemm.linear_dgrad(per_expert, h, 2 * f, rank.d_fc1->get() + first * 2 * f,
                        w1.get() + global * 2 * f * h, rank.d_in->get() + first * h);
      gemm.linear_wgrad_accumulate(per_expert, h, 2 * f, rank.d_fc1->get() + first * 2 * f,
                                   rank.expert_in->get() + first * h,
                                   dw1.get() + global * 2 * f * h);
    }
    moe_regroup(kEp, kLocal, capacity, h, rank.d_in->get(), rank.d_in_src->get(), false, nullptr);
  }
  DHELIX_CUDA(cudaDeviceSynchronize());
  exchange(ranks, &Rank::d_in_src, &Rank::d_permuted, block);
  for (Rank& rank : ranks) {
    moe_permute_backward(shape, rank.view(), rank.d_permuted->get(), rank.dx->get(), nullptr);
  }

  for (int64_t r = 0; r < kEp; ++r) {
    SCOPED_TRACE(::testing::Message() << "EP rank " << r);
    const Rank& rank = ranks[to_size(r)];
    EXPECT_LT(relative_l2(to_f32(rank.y->download()), cpu_y[to_size(r)]), 0.05);
    EXPECT_LT(relative_l2(to_f32(rank.dx->download()), cpu_dx[to_size(r)]), 0.05);
    EXPECT_LT(relative_l2(rank.dgate.download(), cpu_dgate[to_size(r)]), 0.05);
  }
  EXPECT_LT(relative_l2(dw1.download(), cpu_dw1), 0.05);
  EXPECT_LT(relative_l2(dw2.download(), cpu_dw2), 0.05);
}

}  // namespace
}  // namespace dhelix::cuda
