// cuDNN's fused attention (runtime/cuda/cudnn_sdpa.h) against the CPU backend's attention,
// forward and backward, GQA, a sequence that is not a multiple of any tile; the
// deterministic backward repeatable bit for bit; and the set-up's decision on this GPU.
// Skips without a GPU, and without a loadable cuDNN 9 (then dhelix runs its own kernel).
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cuda/attention_self_check.h"
#include "runtime/cuda/cuda_device_api.h"
#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/sdpa_graph.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

const kernels::AttentionShape kShape{
    .batch = 2, .seq = 150, .heads = 4, .kv_heads = 2, .head_dim = 64};

std::unique_ptr<CudnnSdpa> cudnn_or_skip() {
  std::unique_ptr<CudnnSdpa> sdpa = CudnnSdpa::load();
  return sdpa->version() / 10000 == 9 ? std::move(sdpa) : nullptr;
}

#define DHELIX_REQUIRE_CUDNN(sdpa)                                                    \
  DHELIX_REQUIRE_GPUS(1);                                                             \
  std::unique_ptr<CudnnSdpa> sdpa = cudnn_or_skip();                                  \
  if (!sdpa)                                                                          \
  GTEST_SKIP() << "no cuDNN 9 here (built with it: " << CudnnSdpa::built_with_cudnn() \
               << "); dhelix's kernel runs"

TEST(CudnnAttention, ForwardAndBackwardMatchTheCpu) {
  DHELIX_REQUIRE_CUDNN(sdpa);
  const std::optional<std::string> refusal = sdpa->prepare(kShape, false);
  ASSERT_FALSE(refusal.has_value()) << *refusal;
  const kernels::AttentionShape& s = kShape;
  const int64_t q_size = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_size = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  const std::vector<float> q = bf16_rounded(random_floats(q_size, 31));
  const std::vector<float> k = bf16_rounded(random_floats(kv_size, 32));
  const std::vector<float> v = bf16_rounded(random_floats(kv_size, 33));
  const std::vector<float> dout = bf16_rounded(random_floats(q_size, 34));
  std::vector<float> out(q_size), lse(rows), dq(q_size), dk(kv_size), dv(kv_size);
  cpu::attention_forward(s, q.data(), k.data(), v.data(), kernels::kAttentionTileKeys, out.data(),
                         lse.data());

  DeviceBuffer<bf16> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<bf16> d_out(q_size), d_dq(q_size), d_dk(kv_size), d_dv(kv_size);
  DeviceBuffer<float> d_lse(rows), d_delta(rows);
  DeviceBuffer<char> workspace(sdpa->workspace_bytes(s));
  const Workspace ws{workspace.get(), sdpa->workspace_bytes(s)};
  sdpa->forward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), ws, nullptr);
  const std::vector<float> gpu_out = to_f32(d_out.download());
  // cuDNN rounds P to bf16 before P V: looser than dhelix's own kernel's 2e-3.
  expect_close(gpu_out, out, 1e-2f, 1.0f / 64, "out");
  expect_close(d_lse.download(), lse, 1e-3f, 1e-3f, "lse");

  cpu::attention_backward(s, q.data(), k.data(), v.data(), gpu_out.data(), lse.data(), dout.data(),
                          dq.data(), dk.data(), dv.data());
  sdpa->backward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), d_dout.get(),
                 d_dq.get(), d_dk.get(), d_dv.get(), d_delta.get(), ws, nullptr);
  expect_close(to_f32(d_dq.download()), dq, 2e-2f, 1.0f / 32, "dq");
  expect_close(to_f32(d_dk.download()), dk, 2e-2f, 1.0f / 32, "dk");
  expect_close(to_f32(d_dv.download()), dv, 2e-2f, 1.0f / 32, "dv");
}

TEST(CudnnAttention, DeterministicBackwardGivesTheSameBits) {
  DHELIX_REQUIRE_CUDNN(sdpa);
  const std::optional<std::string> refusal = sdpa->prepare(kShape, true);
  if (refusal)
    GTEST_SKIP() << "no deterministic engine here (dhelix's kernel runs under --verify): "
                 << *refusal;
  const kernels::AttentionShape& s = kShape;
  const int64_t q_size = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_size = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  DeviceBuffer<bf16> q(to_bf16(random_floats(q_size, 1))), k(to_bf16(random_floats(kv_size, 2))),
      v(to_bf16(random_floats(kv_size, 3))), dout(to_bf16(random_floats(q_size, 4))), out(q_size);
  DeviceBuffer<float> lse(rows), delta(rows);
  DeviceBuffer<char> workspace(sdpa->workspace_bytes(s));
  const Workspace ws{workspace.get(), sdpa->workspace_bytes(s)};
  sdpa->forward(s, q.get(), k.get(), v.get(), out.get(), lse.get(), ws, nullptr);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<bf16> dq(q_size), dk(kv_size), dv(kv_size);
    sdpa->backward(s, q.get(), k.get(), v.get(), out.get(), lse.get(), dout.get(), dq.get(),
                   dk.get(), dv.get(), delta.get(), ws, nullptr);
    std::vector<float> all = to_f32(dq.download());
    for (const auto& part : {to_f32(dk.download()), to_f32(dv.download())}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(CudnnAttention, TheSetUpChoosesCudnnOnThisGpu) {
  DHELIX_REQUIRE_CUDNN(sdpa);
  AttentionSetup setup;
  setup.shape = kShape;
  CudaDeviceApi api;  // the self-check runs on a non-blocking stream, as at set-up
  const StreamHandle stream = api.create_stream(/*high_priority=*/false);
  const AttentionDecision decision = prepare_attention_path(api, *sdpa, setup, stream);
  api.destroy_stream(stream);
  EXPECT_EQ(decision.path, AttentionPath::kCudnn) << decision.reason;
  std::cout << "attention: " << decision.reason << "\n";
}

// Needs no GPU, only cuDNN's library: cuDNN itself checks every tensor, every node
// (matmul, pointwise, reduction, reshape: shapes, strides, types, broadcasting) and the
// operation graph's wiring when they are finalized. Runs on the build machine.
TEST(CudnnAttentionGraph, CudnnAcceptsEveryNodeOfEveryVariantInBothForms) {
  for (const kernels::AttentionShape& shape : {kShape, kernels::AttentionShape{1, 64, 4, 4, 128},
                                               kernels::AttentionShape{2, 100, 8, 1, 32}}) {
    const int64_t version = 91900;
    std::vector<SdpaGraph> graphs;
    for (const SdpaGraphForm form : kSdpaGraphForms) {
      graphs.push_back(sdpa_forward_graph(shape, version, form));
      graphs.push_back(sdpa_backward_graph(shape, version, false, form));
      graphs.push_back(sdpa_backward_graph(shape, version, true, form));
    }
    for (const SdpaGraph& graph : graphs) {
      bool loaded = false;
      const std::optional<std::string> problem = check_graph_descriptors(graph, &loaded);
      if (!loaded) GTEST_SKIP() << "no cuDNN 9 library here: " << problem.value_or("");
      EXPECT_FALSE(problem.has_value()) << *problem;
    }
  }
}

// The check above can fail: without a GPU cuDNN still checks each matmul's batch, m, n and
// k extents, attribute names and types, and GEN_INDEX's axis (it does not check pointwise
// broadcasting or strides until a plan is built on a GPU).
TEST(CudnnAttentionGraph, CudnnRefusesAMatmulWhoseShapesDisagree) {
  for (const auto& [what, mutate] : std::vector<std::pair<const char*, void (*)(SdpaTensor&)>>{
           {"rows", [](SdpaTensor& o) { o.dims[2] += 1; }},
           {"heads", [](SdpaTensor& o) { o.dims[1] = 3; }}}) {
    SdpaGraph graph = sdpa_forward_graph(kShape, 91900);
    for (SdpaTensor& t : graph.tensors) {
      if (t.uid == kSdpaO) mutate(t);
    }
    bool loaded = false;
    const std::optional<std::string> problem = check_graph_descriptors(graph, &loaded);
    if (!loaded) GTEST_SKIP() << "no cuDNN 9 library here";
    ASSERT_TRUE(problem.has_value()) << what;
    EXPECT_NE(problem->find("node bmm2_p_v: "), std::string::npos) << *problem;
    EXPECT_NE(problem->find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << *problem;
  }
}

}  // namespace
}  // namespace dhelix::cuda
