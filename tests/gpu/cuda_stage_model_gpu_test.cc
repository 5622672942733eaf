// The model on the CUDA backend against the same model on the CPU (tp = 1, the whole
// 2-layer tiny Llama, one micro-batch): the same op wiring (runtime/model/*) run with bf16
// activations must give the CPU's loss and gradients within bf16's error. Skips without a
// GPU.
//
// Tolerances. bf16 keeps 8 significant bits: each stored activation is off by up to 2^-9
// relative (0.2 %). Two layers of about a dozen rounded tensors each compound that to a
// few percent on individual gradient elements, so elements are not compared one by one;
// whole tensors are, by relative L2 error (|g_gpu - g_cpu| / |g_cpu| < 5 %), which a wiring
// error (a wrong buffer, a missing accumulation, a transposed GEMM) exceeds by far: it
// gives errors of order 100 %. The loss, an average over 32 tokens, agrees to 1 %.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/placement.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/cuda_stage_model.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/train/context_split.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::test {
namespace {

double relative_l2_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - static_cast<double>(expected[i]);
    difference += d * d;
    norm += static_cast<double>(expected[i]) * static_cast<double>(expected[i]);
  }
  return norm == 0.0 ? std::sqrt(difference) : std::sqrt(difference / norm);
}

// One stream, its GEMM handle and a pool: what a CUDA model needs to run its ops.
struct DeviceContext {
  DeviceContext() {
    DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = std::make_unique<cuda::CublasGemm>(stream);
    pool = std::make_unique<cuda::DevicePool>(stream);
    DHELIX_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  }
  ~DeviceContext() {
    static_cast<void>(cudaStreamSynchronize(stream));
    pool.reset();
    gemm.reset();
    static_cast<void>(cudaFree(workspace));
    static_cast<void>(cudaStreamDestroy(stream));
  }
  cuda::CudaBackend::Exec exec() const {
    return {.stream = stream, .gemm = gemm.get(), .workspace = {workspace, kWorkspaceBytes}};
  }
  static constexpr int64_t kWorkspaceBytes = int64_t{4} << 20;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::unique_ptr<cuda::CublasGemm> gemm;
  std::unique_ptr<cuda::DevicePool> pool;
};

std::vector<float> download_gradient(const cuda::CudaStageModel::ParameterView& p) {
  std::vector<float> host(static_cast<size_t>(p.count));
  DHELIX_CUDA(cudaDeviceSynchronize());
  DHELIX_CUDA(
      cudaMemcpy(host.data(), p.gradient, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

TEST(CudaStageModel, MatchesTheCpuModelWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  const JobSpec job = tiny_job(1, false);
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 11);

  TpGroup cpu(job, 7);
  cpu.start_iteration(1);
  cpu.set_tokens(0, tokens);
  cpu.forward(0);
  cpu.backward(0);

  DeviceContext device;
  BasicTpGroup<cuda::CudaBackend> gpu(job, 7, 0, 0, -1, true, true,
                                      cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                      device.exec());
  gpu.start_iteration(1);
  gpu.set_tokens(0, tokens);
  gpu.forward(0);
  gpu.backward(0);
  DHELIX_CUDA(cudaStreamSynchronize(device.stream));

  const float cpu_loss = cpu.model(0).micro_batch_losses().at(0);
  const float gpu_loss = gpu.model(0).micro_batch_losses().at(0);
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);

  const std::vector<rt::ParameterView> expected = cpu.model(0).parameters();
  const std::vector<cuda::CudaStageModel::ParameterView> actual = gpu.model(0).parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].name, expected[i].name);
    const std::vector<float> want(expected[i].gradient, expected[i].gradient + expected[i].count);
    EXPECT_LT(relative_l2_error(download_gradient(actual[i]), want), 0.05) << expected[i].name;
  }
}

// A MoE model (4 experts, top-2, capacity factor 0.75 so that copies are dropped; ep = 1)
// through CudaStageModel's binding of runtime/cuda/moe_layers_cuda.h against the CPU model:
// the same bounds as the dense model above, the aux loss within 1 %, the dropped copies equal;
// with a shared expert of `shared_width` (0: none; runtime/model/moe_shared_expert_padded.h).
void expect_moe_model_within_bf16_error(int64_t shared_width) {
  JobSpec job = tiny_job(1, false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 0.75,
                          .expert_ffn_hidden_size = 32,
                          .shared_expert_ffn_hidden_size = shared_width,
                          .aux_loss_coeff = 0.01};
  const rt::MicroBatchTokens tokens = random_tokens(32, 256, 11);

  TpGroup cpu(job, 7);
  cpu.start_iteration(1);
  cpu.set_tokens(0, tokens);
  cpu.forward(0);
  cpu.backward(0);

  DeviceContext device;
  BasicTpGroup<cuda::CudaBackend> gpu(job, 7, 0, 0, -1, true, true,
                                      cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                      device.exec());
  gpu.start_iteration(1);
  gpu.set_tokens(0, tokens);
  gpu.forward(0);
  gpu.backward(0);
  DHELIX_CUDA(cudaStreamSynchronize(device.stream));

  const float cpu_loss = cpu.model(0).micro_batch_losses().at(0);
  const float gpu_loss = gpu.model(0).micro_batch_losses().at(0);
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);
  const float cpu_aux = cpu.model(0).moe_aux_loss_sum(1);
  EXPECT_GT(cpu_aux, 0.0f);
  EXPECT_NEAR(gpu.model(0).moe_aux_loss_sum(1), cpu_aux, 0.01 * cpu_aux);
  EXPECT_GT(cpu.model(0).moe_dropped_copies(), 0);

  const std::vector<rt::ParameterView> expected = cpu.model(0).parameters();
  const std::vector<cuda::CudaStageModel::ParameterView> actual = gpu.model(0).parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].name, expected[i].name);
    EXPECT_EQ(actual[i].expert, expected[i].expert) << expected[i].name;
    const std::vector<float> want(expected[i].gradient, expected[i].gradient + expected[i].count);
    EXPECT_LT(relative_l2_error(download_gradient(actual[i]), want), 0.05) << expected[i].name;
  }
}

TEST(CudaStageModel, MoeModelMatchesTheCpuModelWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  expect_moe_model_within_bf16_error(0);
}

TEST(CudaStageModel, MoeModelWithASharedExpertMatchesTheCpuModelWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  expect_moe_model_within_bf16_error(32);
}

TEST(CudaStageModel, RunningTheIterationTwiceGivesTheSameBits) {
  DHELIX_REQUIRE_GPUS(1);
  const JobSpec job = tiny_job(1, false);
  DeviceContext device;
  BasicTpGroup<cuda::CudaBackend> gpu(job, 7, 0, 0, -1, true, true,
                                      cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                      device.exec());
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    gpu.start_iteration(1);
    gpu.set_tokens(0, random_tokens(32, 256, 11));
    gpu.forward(0);
    gpu.backward(0);
    DHELIX_CUDA(cudaStreamSynchronize(device.stream));
    const auto params = gpu.model(0).parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<float> gradient = download_gradient(params[i]);
      if (run == 0) {
        first.push_back(gradient);
      } else {
        EXPECT_EQ(gradient, first[i]) << params[i].name << ": the kernels are not deterministic";
      }
    }
  }
}

// A CP group of tp = 1 on backend B, every CP rank's model in this process: ops run in DAG
// order on every rank in lockstep, a ring step copies each member's message to the next
// member (the ring's data movement, without NCCL), with the before and after steps the
// executor runs around it. tp = 1, so the other collectives are groups of one.
template <class B>
class CpGroup {
 public:
  using Model = rt::BasicStageModel<B>;
  using Copy = std::function<void(const void* from, void* to, int64_t bytes)>;
  CpGroup(const JobSpec& job, typename B::MemoryConfig memory, typename B::Exec exec, Copy copy)
      : job_(job), exec_(exec), copy_(std::move(copy)) {
    const Placement placement(job.parallel, job.cluster.gpus_per_node);
    for (int64_t r = 0; r < job.parallel.cp; ++r) {
      RankCoordinates where;
      where.cp = r;
      models_.push_back(std::make_unique<Model>(
          job, placement.rank_of(where),
          std::vector<std::pair<int64_t, int64_t>>{{0, job.model.num_layers}}, true, true, 7,
          memory));
    }
    const int64_t rank = placement.rank_of(RankCoordinates{});
    dags_ = build_layer_dags(job, rank);
    extras_ = build_stage_extras(job, rank, true, true);
  }
  Model& model(int64_t r) { return *models_[static_cast<size_t>(r)]; }
  int64_t size() const { return static_cast<int64_t>(models_.size()); }

  // One micro-batch's forward and backward over `full` (whole sequences).
  void iteration(const rt::MicroBatchTokens& full) {
    const ParallelSpec& p = job_.parallel;
    for (int64_t r = 0; r < size(); ++r) {
      model(r).start_iteration(1);
      model(r).set_tokens(
          0, rt::context_parallel_share(full, p.micro_batch_size, p.seq_length, p.cp, r));
    }
    run_extras(extras_.forward, true);
    for (int64_t layer = 0; layer < job_.model.num_layers; ++layer) {
      for (int64_t i : dags_.forward.topological_order()) run(dags_.forward.op(i).id, layer);
    }
    run_extras(extras_.forward, false);
    run_extras(extras_.backward, false);
    for (int64_t layer = job_.model.num_layers - 1; layer >= 0; --layer) {
      for (int64_t i : dags_.backward.topological_order()) run(dags_.backward.op(i).id, layer);
    }
    run_extras(extras_.backward, true);
  }

 private:
  void run_extras(const LayerDag& dag, bool embedding_part) {
    for (int64_t i : dag.topological_order()) {
      const std::string& id = dag.op(i).id;
      if ((id.find("embedding") != std::string::npos) == embedding_part) run(id, -1);
    }
  }

  void run(const std::string& op, int64_t layer) {
    std::vector<typename Model::BoundOp> bound;
    for (auto& m : models_) bound.push_back(m->bind(rt::OpRef{op, layer, 0}));
    if (!bound[0].collective) {
      for (auto& b : bound) b.compute(exec_);
      return;
    }
    for (auto& b : bound) {
      if (b.before_collective) b.before_collective(exec_);
    }
    const int64_t n = size();
    for (int64_t r = 0; r < n; ++r) {
      const rt::CollectiveRequest& q = *bound[static_cast<size_t>(r)].collective;
      const int64_t bytes = q.count * (q.element == rt::ElementType::kFloat32 ? 4 : 2);
      switch (q.kind) {
        case rt::CollectiveKind::kRingExchange:  // from the previous member
          copy_(bound[static_cast<size_t>((r + n - 1) % n)].collective->in, q.out, bytes);
          break;
        case rt::CollectiveKind::kAllGather:  // tp = 1: groups of one
        case rt::CollectiveKind::kReduceScatter:
          copy_(q.in, q.out, bytes);
          break;
        case rt::CollectiveKind::kAllReduce:
          break;
        case rt::CollectiveKind::kAllToAllV:
          FAIL() << "all_to_all_v in the CP harness";
      }
    }
    for (auto& b : bound) {
      if (b.after_collective) b.after_collective(exec_);
    }
  }

  JobSpec job_;
  typename B::Exec exec_;
  Copy copy_;
  std::vector<std::unique_ptr<Model>> models_;
  LayerDags dags_;
  LayerDags extras_;
};

// The CUDA model's CP layers (ring attention kernels, RoPE at global positions, the dK/dV
// ring's sums) against the CPU's: CP 2, tp 1, sequences of 64 (chunks of 16). The mean loss
// over the CP ranks within 1 %, each parameter's gradient summed over the CP ranks (what
// the DP x CP sum gives) within 5 % relative L2, the bf16 bounds of the test above.
TEST(CudaStageModel, ContextParallelLayersMatchTheCpuWithinBf16Error) {
  DHELIX_REQUIRE_GPUS(1);
  JobSpec job = tiny_job(1, false);
  job.parallel.cp = 2;
  job.parallel.seq_length = 64;
  const rt::MicroBatchTokens full = random_tokens(2 * 64, 256, 13);

  CpGroup<rt::CpuBackend> cpu(job, {}, {}, [](const void* from, void* to, int64_t bytes) {
    std::memcpy(to, from, static_cast<size_t>(bytes));
  });
  cpu.iteration(full);

  DeviceContext device;
  const cudaStream_t stream = device.stream;
  CpGroup<cuda::CudaBackend> gpu(job, cuda::CudaBackend::MemoryConfig{device.pool.get()},
                                 device.exec(),
                                 [stream](const void* from, void* to, int64_t bytes) {
                                   DHELIX_CUDA(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes),
                                                               cudaMemcpyDeviceToDevice, stream));
                                 });
  gpu.iteration(full);
  DHELIX_CUDA(cudaStreamSynchronize(stream));

  float cpu_loss = 0.0f, gpu_loss = 0.0f;
  for (int64_t r = 0; r < 2; ++r) {
    cpu_loss += cpu.model(r).micro_batch_losses().at(0) / 2;
    gpu_loss += gpu.model(r).micro_batch_losses().at(0) / 2;
  }
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);

  const std::vector<rt::ParameterView> names = cpu.model(0).parameters();
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<float> want(static_cast<size_t>(names[i].count), 0.0f), got = want;
    for (int64_t r = 0; r < 2; ++r) {
      const rt::ParameterView p = cpu.model(r).parameters()[i];
      const std::vector<float> g = download_gradient(gpu.model(r).parameters()[i]);
      ASSERT_EQ(gpu.model(r).parameters()[i].name, p.name);
      for (size_t j = 0; j < want.size(); ++j) {
        want[j] += p.gradient[j];
        got[j] += g[j];
      }
    }
    EXPECT_LT(relative_l2_error(got, want), 0.05) << names[i].name;
  }
}

// An FSDP DP group (optim_grads_params, tp = 1) on backend B, every DP rank's model in
// this process: every op of the layer DAGs (the fsdp ops included) in DAG order on every
// rank in lockstep, one micro-batch; the fsdp collectives applied through the host
// (`to_host`, `from_host`: the communicators' contract, all_gather in rank order and
// reduce_scatter summed in rank order), with the before and after steps the executor runs
// around them (on CUDA: the bf16 copy of the gathered weights, the releases).
template <class B>
class FsdpDpGroup {
 public:
  using Model = rt::BasicStageModel<B>;
  using ToHost = std::function<std::vector<float>(const float*, int64_t)>;
  using FromHost = std::function<void(const std::vector<float>&, float*)>;
  FsdpDpGroup(JobSpec job, bool fsdp, typename B::MemoryConfig memory, typename B::Exec exec,
              ToHost to_host, FromHost from_host)
      : exec_(exec), to_host_(std::move(to_host)), from_host_(std::move(from_host)) {
    job.parallel.use_megatron_fsdp = fsdp;
    job.parallel.fsdp_sharding =
        fsdp ? FsdpShardingStrategy::kOptimGradsParams : FsdpShardingStrategy::kNoShard;
    const Placement placement(job.parallel, job.cluster.gpus_per_node);
    for (int64_t r = 0; r < job.parallel.dp; ++r) {
      RankCoordinates where;
      where.dp = r;
      models_.push_back(std::make_unique<Model>(
          job, placement.rank_of(where),
          std::vector<std::pair<int64_t, int64_t>>{{0, job.model.num_layers}}, true, true, 7,
          memory, rt::FsdpSettings{.enabled = fsdp, .reshard_after_forward = true}));
    }
    dags_ = build_layer_dags(job, 0);
    extras_ = build_stage_extras(job, 0, true, true);
    layers_ = job.model.num_layers;
  }
  Model& model(int64_t r) { return *models_[static_cast<size_t>(r)]; }

  // One micro-batch of rank-own tokens; then the reduced shards summed (finish_iteration).
  void iteration() {
    for (size_t r = 0; r < models_.size(); ++r) {
      models_[r]->start_iteration(1);
      models_[r]->set_tokens(0, random_tokens(32, 256, static_cast<uint32_t>(100 * r)));
    }
    run_extras(extras_.forward, true);
    for (int64_t l = 0; l < layers_; ++l) {
      for (int64_t i : dags_.forward.topological_order()) run(dags_.forward.op(i).id, l);
    }
    run_extras(extras_.forward, false);
    run_extras(extras_.backward, false);
    for (int64_t l = layers_ - 1; l >= 0; --l) {
      for (int64_t i : dags_.backward.topological_order()) run(dags_.backward.op(i).id, l);
    }
    run_extras(extras_.backward, true);
    for (auto& m : models_) m->finish_iteration(exec_);
  }

 private:
  void run_extras(const LayerDag& dag, bool embedding_part) {
    for (int64_t i : dag.topological_order()) {
      const std::string& id = dag.op(i).id;
      if ((id.find("embedding") != std::string::npos) == embedding_part) run(id, -1);
    }
  }
  void run(const std::string& op, int64_t layer) {
    std::vector<typename Model::BoundOp> bound;
    for (auto& m : models_) bound.push_back(m->bind(rt::OpRef{op, layer, 0}));
    if (!bound[0].collective) {
      for (auto& b : bound) b.compute(exec_);
      return;
    }
    ASSERT_NE(op.find("fsdp"), std::string::npos) << op << ": tp = 1 has no other collective";
    for (auto& b : bound) {
      if (b.before_collective) b.before_collective(exec_);
    }
    const size_t n = bound.size();
    const int64_t count = bound[0].collective->count;
    const bool gather = bound[0].collective->kind == rt::CollectiveKind::kAllGather;
    std::vector<std::vector<float>> in;
    for (auto& b : bound) {
      const float* data = static_cast<const float*>(b.collective->in);
      in.push_back(to_host_(data, gather ? count : count * static_cast<int64_t>(n)));
    }
    for (size_t r = 0; r < n; ++r) {
      std::vector<float> out;
      if (gather) {
        for (const std::vector<float>& part : in) out.insert(out.end(), part.begin(), part.end());
      } else {
        out.assign(static_cast<size_t>(count), 0.0f);
        for (const std::vector<float>& whole : in) {
          for (int64_t i = 0; i < count; ++i) {
            out[static_cast<size_t>(i)] += whole[r * static_cast<size_t>(count) + i];
          }
        }
      }
      from_host_(out, static_cast<float*>(bound[r].collective->out));
    }
    for (auto& b : bound) {
      if (b.after_collective) b.after_collective(exec_);
    }
  }

  typename B::Exec exec_;
  ToHost to_host_;
  FromHost from_host_;
  std::vector<std::unique_ptr<Model>> models_;
  LayerDags dags_, extras_;
  int64_t layers_ = 0;
};

// FSDP on the CUDA model (runtime/model/fsdp_layers.h on CudaBackend: the gathered weights'
// bf16 copy, the releases and zeroings on the stream, the shard sums) against the CPU's FSDP
// model: DP 2, one micro-batch each. The harness first holds the CPU's FSDP losses equal to
// plain DP's bit for bit (which runs without a GPU too); then each rank's loss on the GPU
// within 1 % and each rank's shard gradients within 5 % relative L2 of the CPU's.
TEST(CudaStageModel, FsdpShardsMatchTheCpuWithinBf16Error) {
  JobSpec job = tiny_job(1, false);
  job.parallel.dp = 2;
  job.parallel.global_batch_size = 4;
  const auto host_copy = [](const float* data, int64_t count) {
    return std::vector<float>(data, data + count);
  };
  const auto host_store = [](const std::vector<float>& values, float* out) {
    std::copy(values.begin(), values.end(), out);
  };
  FsdpDpGroup<rt::CpuBackend> plain(job, false, {}, {}, host_copy, host_store);
  FsdpDpGroup<rt::CpuBackend> cpu(job, true, {}, {}, host_copy, host_store);
  plain.iteration();
  cpu.iteration();
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(cpu.model(r).micro_batch_losses().at(0), plain.model(r).micro_batch_losses().at(0));
  }

  DHELIX_REQUIRE_GPUS(1);
  DeviceContext device;
  const cudaStream_t stream = device.stream;
  FsdpDpGroup<cuda::CudaBackend> gpu(
      job, true, cuda::CudaBackend::MemoryConfig{device.pool.get()}, device.exec(),
      [stream](const float* data, int64_t count) {
        std::vector<float> host(static_cast<size_t>(count));
        DHELIX_CUDA(cudaStreamSynchronize(stream));
        DHELIX_CUDA(
            cudaMemcpy(host.data(), data, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return host;
      },
      [stream](const std::vector<float>& values, float* out) {
        DHELIX_CUDA(cudaStreamSynchronize(stream));
        DHELIX_CUDA(
            cudaMemcpy(out, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
      });
  gpu.iteration();
  DHELIX_CUDA(cudaStreamSynchronize(stream));
  for (int64_t r = 0; r < 2; ++r) {
    const float want = cpu.model(r).micro_batch_losses().at(0);
    EXPECT_NEAR(gpu.model(r).micro_batch_losses().at(0), want, 0.01 * want);
    const std::vector<rt::ParameterView> cpu_params = cpu.model(r).parameters();
    const auto gpu_params = gpu.model(r).parameters();
    ASSERT_EQ(gpu_params.size(), cpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      ASSERT_EQ(gpu_params[i].name, cpu_params[i].name);
      EXPECT_EQ(gpu_params[i].fsdp_shard, cpu_params[i].fsdp_shard);
      const rt::ParameterView& p = cpu_params[i];
      EXPECT_LT(relative_l2_error(download_gradient(gpu_params[i]),
                                  std::vector<float>(p.gradient, p.gradient + p.count)),
                0.05)
          << "rank " << r << ": " << p.name;
    }
  }
}

}  // namespace
}  // namespace dhelix::test
