// The CUDA MoE kernels (runtime/cuda/moe_cuda.h) against the CPU backend's
// (runtime/cpu/moe_cpu.h) on bf16-rounded inputs: the routing on the same logits exactly
// (chosen experts, kept assignments, padded rows, counts), its weights and the aux loss
// within fp32 rounding, and the permutation, combine and their backward within the bf16
// tolerances of docs/kernels.md (rel 2^-7 on bf16 outputs). A capacity factor of 0.75
// makes experts drop assignments; the padding rows must stay zero.
#include <gtest/gtest.h>

#include <vector>

#include "lib/error.h"
#include "runtime/cpu/moe_cpu.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

constexpr int64_t kTokens = 24, kHidden = 16, kExperts = 4, kTopK = 2;
constexpr double kCf = 0.75, kAlpha = 0.01;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

// The routing buffers of one micro-batch on the device.
struct DeviceRouting {
  DeviceBuffer<int32_t> chosen{kTokens * kTopK};
  DeviceBuffer<float> gate{kTokens * kTopK}, probs{kTokens * kExperts}, aux{1};
  DeviceBuffer<uint8_t> kept{kTokens * kTopK};
  DeviceBuffer<int64_t> row{kTokens * kTopK}, routed{kExperts}, counts{kExperts};
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

struct Fixture {
  cpu::MoeLayerShape cpu_shape{.tokens = kTokens,
                               .hidden = kHidden,
                               .experts = kExperts,
                               .top_k = kTopK,
                               .ffn = 8,
                               .capacity_factor = kCf,
                               .aux_loss_coeff = kAlpha};
  MoeDeviceShape shape;
  cpu::MoeRouting routing;
  DeviceRouting device;
  std::vector<int64_t> first_slot;  // the CPU's first slot of each expert

  Fixture() {
    shape = {.tokens = kTokens,
             .hidden = kHidden,
             .experts = kExperts,
             .top_k = kTopK,
             .capacity = kernels::expert_capacity(kTokens, kTopK, kExperts, kCf),
             .aux_loss_coeff = kAlpha};
    routing.logits = bf16_rounded(random_floats(kTokens * kExperts, 1, -2.0f, 2.0f));
    cpu::moe_route_logits(cpu_shape, routing);
    DeviceBuffer<bf16> logits(to_bf16(routing.logits));
    const int64_t workspace_bytes = moe_route_workspace_bytes(kTokens, kTopK, kExperts);
    DeviceBuffer<char> workspace(workspace_bytes);
    moe_route(shape, logits.get(), device.view(), {workspace.get(), workspace_bytes}, nullptr);
    DHELIX_CUDA(cudaDeviceSynchronize());
    first_slot.assign(to_size(kExperts), 0);
    for (int64_t e = 1; e < kExperts; ++e) {
      first_slot[to_size(e)] = first_slot[to_size(e - 1)] + routing.expert_rows[to_size(e - 1)];
    }
  }
  int64_t padded_rows() const { return kernels::padded_rows(kExperts, shape.capacity); }
  // The padded row of the CPU's slot `slot` of expert e.
  int64_t padded_of(int64_t e, int64_t slot) const {
    return e * shape.capacity + slot - first_slot[to_size(e)];
  }
  // CPU compact rows [slots, h] from a padded buffer, and the reverse (padding zero).
  std::vector<float> compact(const std::vector<float>& padded) const {
    std::vector<float> out(to_size(routing.slots() * kHidden));
    for (int64_t a = 0; a < kTokens * kTopK; ++a) {
      const int64_t slot = routing.slot_of[to_size(a)];
      if (slot < 0) continue;
      const int64_t p = padded_of(routing.chosen[to_size(a)], slot);
      for (int64_t i = 0; i < kHidden; ++i) {
        out[to_size(slot * kHidden + i)] = padded[to_size(p * kHidden + i)];
      }
    }
    return out;
  }
  std::vector<float> padded(const std::vector<float>& compact_rows) const {
    std::vector<float> out(to_size(padded_rows() * kHidden), 0.0f);
    for (int64_t a = 0; a < kTokens * kTopK; ++a) {
      const int64_t slot = routing.slot_of[to_size(a)];
      if (slot < 0) continue;
      const int64_t p = padded_of(routing.chosen[to_size(a)], slot);
      for (int64_t i = 0; i < kHidden; ++i) {
        out[to_size(p * kHidden + i)] = compact_rows[to_size(slot * kHidden + i)];
      }
    }
    return out;
  }
};

TEST(CudaMoe, RoutingEqualsTheCpuOnTheSameLogits) {
  DHELIX_REQUIRE_GPUS(1);
  Fixture f;
  ASSERT_EQ(f.shape.capacity, 9);  // ceil(0.75 * 24 * 2 / 4)
  ASSERT_GT(f.routing.dropped, 0) << "the fixture should drop assignments";
  EXPECT_EQ(f.device.chosen.download(), f.routing.chosen);
  EXPECT_EQ(f.device.kept.download(), f.routing.kept);
  expect_close(f.device.gate.download(), f.routing.gate, 1e-6f, 1e-6f, "gate");
  expect_close(f.device.probs.download(), f.routing.probs, 1e-6f, 1e-6f, "probs");
  EXPECT_EQ(f.device.routed.download(), f.routing.routed);
  const std::vector<int64_t> rows = f.device.row.download();
  const std::vector<int64_t> counts = f.device.counts.download();
  for (int64_t a = 0; a < kTokens * kTopK; ++a) {
    const int64_t slot = f.routing.slot_of[to_size(a)];
    EXPECT_EQ(rows[to_size(a)], slot < 0 ? -1 : f.padded_of(f.routing.chosen[to_size(a)], slot))
        << "assignment " << a;
  }
  for (int64_t e = 0; e < kExperts; ++e) {
    EXPECT_EQ(counts[to_size(e)], f.routing.expert_rows[to_size(e)] * kHidden) << "expert " << e;
  }
  expect_close(f.device.aux.download(), {f.routing.aux_loss}, 1e-7f, 1e-5f, "aux loss");
}

TEST(CudaMoe, PermuteAndCombineMatchTheCpu) {
  DHELIX_REQUIRE_GPUS(1);
  Fixture f;
  const std::vector<float> x = bf16_rounded(random_floats(kTokens * kHidden, 2));
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_permuted(f.padded_rows() * kHidden);
  // Garbage first: permute must zero the padding itself.
  d_permuted.upload(to_bf16(random_floats(f.padded_rows() * kHidden, 9)));
  moe_permute(f.shape, f.device.view(), d_x.get(), d_permuted.get(), nullptr);
  std::vector<float> cpu_permuted(to_size(f.routing.slots() * kHidden));
  cpu::moe_permute(f.cpu_shape, f.routing, x.data(), cpu_permuted.data());
  EXPECT_EQ(to_f32(d_permuted.download()), f.padded(cpu_permuted));  // copies: exact

  // Combine from expert outputs given in the padded layout (random in the padding too:
  // unpermute must not read it).
  const std::vector<float> out = bf16_rounded(random_floats(f.padded_rows() * kHidden, 3));
  DeviceBuffer<bf16> d_out(to_bf16(out)), d_y(kTokens * kHidden);
  moe_unpermute(f.shape, f.device.view(), d_out.get(), d_y.get(), nullptr);
  std::vector<float> y(to_size(kTokens * kHidden));
  const std::vector<float> out_compact = f.compact(out);
  cpu::moe_unpermute(f.cpu_shape, f.routing, out_compact.data(), y.data());
  expect_close(to_f32(d_y.download()), y, 1e-3f, 1.0f / 128, "y");

  // Backward of the combine.
  const std::vector<float> dy = bf16_rounded(random_floats(kTokens * kHidden, 4));
  DeviceBuffer<bf16> d_dy(to_bf16(dy)), d_dout(f.padded_rows() * kHidden);
  DeviceBuffer<float> d_dgate(kTokens * kTopK);
  d_dout.upload(to_bf16(random_floats(f.padded_rows() * kHidden, 10)));
  moe_unpermute_backward(f.shape, f.device.view(), d_dy.get(), d_out.get(), d_dout.get(),
                         d_dgate.get(), nullptr);
  std::vector<float> dout(to_size(f.routing.slots() * kHidden)), dgate(to_size(kTokens * kTopK));
  cpu::moe_unpermute_backward(f.cpu_shape, f.routing, dy.data(), out_compact.data(), dout.data(),
                              dgate.data());
  expect_close(to_f32(d_dout.download()), f.padded(dout), 1e-3f, 1.0f / 128, "d expert out");
  expect_close(d_dgate.download(), dgate, 1e-5f, 1e-5f, "dgate");

  // Backward of the permutation, from a padded gradient with garbage in the padding.
  std::vector<float> d_perm = bf16_rounded(random_floats(f.padded_rows() * kHidden, 5));
  DeviceBuffer<bf16> d_d_perm(to_bf16(d_perm)), d_dx(kTokens * kHidden);
  moe_permute_backward(f.shape, f.device.view(), d_d_perm.get(), d_dx.get(), nullptr);
  std::vector<float> dx(to_size(kTokens * kHidden));
  const std::vector<float> d_perm_compact = f.compact(d_perm);
  cpu::moe_permute_backward(f.cpu_shape, f.routing, d_perm_compact.data(), dx.data());
  expect_close(to_f32(d_dx.download()), dx, 1e-3f, 1.0f / 128, "dx");

  // The router's logit gradient with the aux loss.
  const float aux_dloss = 0.5f;
  DeviceBuffer<bf16> d_dz(kTokens * kExperts);
  moe_router_logits_backward(f.shape, f.device.view(), d_dgate.get(), aux_dloss, d_dz.get(),
                             nullptr);
  std::vector<float> dz(to_size(kTokens * kExperts));
  cpu::moe_router_logits_backward(f.cpu_shape, f.routing, d_dgate.download().data(), aux_dloss,
                                  dz.data());
  expect_close(to_f32(d_dz.download()), dz, 1e-4f, 1.0f / 128, "dz");
}

TEST(CudaMoe, RegroupIsTheHostMappingAndItsInverse) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t ep = 2, local = 3, capacity = 5, h = 4, rows = ep * local * capacity;
  const std::vector<float> in = bf16_rounded(random_floats(rows * h, 6));
  DeviceBuffer<bf16> d_in(to_bf16(in)), d_mid(rows * h), d_back(rows * h);
  moe_regroup(ep, local, capacity, h, d_in.get(), d_mid.get(), true, nullptr);
  moe_regroup(ep, local, capacity, h, d_mid.get(), d_back.get(), false, nullptr);
  const std::vector<float> mid = to_f32(d_mid.download());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t to = kernels::padded_regroup_row(r, ep, local, capacity, true);
    for (int64_t i = 0; i < h; ++i) EXPECT_EQ(mid[to_size(to * h + i)], in[to_size(r * h + i)]);
  }
  EXPECT_EQ(to_f32(d_back.download()), in);
}

TEST(CudaMoe, RoutingIsDeterministic) {
  DHELIX_REQUIRE_GPUS(1);
  Fixture a, b;
  EXPECT_EQ(a.device.row.download(), b.device.row.download());
  const std::vector<float> la = a.device.aux.download(), lb = b.device.aux.download();
  EXPECT_EQ(la, lb);
}

TEST(CudaMoe, RefusesACapacityOfZeroByName) {
  MoeDeviceShape shape{.tokens = 4, .hidden = 2, .experts = 4, .top_k = 2, .capacity = 0};
  try {
    check_moe_shape(shape);
    FAIL() << "capacity 0 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("capacity is 0"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace dhelix::cuda
