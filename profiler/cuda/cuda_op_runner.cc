#include "profiler/cuda/cuda_op_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <tuple>

#include "lib/error.h"
#include "profiler/cuda/cuda_setup.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/cuda/attention_self_check.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_device_api.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cuda_profile {
namespace {

// Host chunk the GEMM operands are filled from, elements.
constexpr int64_t kFillChunkElements = int64_t{1} << 20;

// Device memory freed with the last closure that uses it.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) {
    DHELIX_CUDA(cudaMalloc(&data_, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  }
  ~DeviceBuffer() { (void)cudaFree(data_); }  // destructors must not throw
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  char* bytes() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
};

using Buffer = std::shared_ptr<DeviceBuffer>;

Buffer zeroed(int64_t bytes) {
  auto buffer = std::make_shared<DeviceBuffer>(bytes);
  DHELIX_CUDA(cudaMemset(buffer->get(), 0, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return buffer;
}

// A buffer of `elements` random operands (random_operand_bytes), one host chunk repeated.
Buffer random_operands(DType dtype, int64_t elements, uint64_t seed) {
  const int64_t width = dtype_bytes(dtype);
  auto buffer = std::make_shared<DeviceBuffer>(elements * width);
  const std::vector<unsigned char> chunk =
      random_operand_bytes(dtype, std::min(elements, kFillChunkElements), seed);
  for (int64_t at = 0; at < elements; at += kFillChunkElements) {
    const int64_t count = std::min(kFillChunkElements, elements - at);
    DHELIX_CUDA(cudaMemcpy(buffer->bytes() + at * width, chunk.data(),
                           static_cast<size_t>(count * width), cudaMemcpyHostToDevice));
  }
  return buffer;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kFp16:
      return ncclFloat16;
    case DType::kFp32:
      return ncclFloat32;
  }
  return ncclBfloat16;
}

// The runtime's GEMM call (cublas_gemm.h, enqueue_gemm), once per expert of a batch, on
// operands of the runtime's types: bf16 A and B, C fp32 (zeroed: a weight gradient
// accumulates into it) or bf16.
Enqueue gemm_closure(cublasHandle_t handle, const OpLaunchPlan& plan, uint64_t seed) {
  const GemmLaunch g = plan.gemm;
  const cuda::GemmShape call = g.call;
  const int64_t c_width = call.fp32_output ? 4 : 2;
  Buffer a = random_operands(DType::kBf16, g.batch * call.m * call.k, seed);
  Buffer b = random_operands(DType::kBf16, g.batch * call.k * call.n, seed + 1);
  Buffer c = zeroed(g.batch * call.m * call.n * c_width);
  const std::vector<GemmCallAt> calls = gemm_calls(g);
  return [=](cudaStream_t stream) {
    DHELIX_CUBLAS(cublasSetStream(handle, stream));
    const auto* a0 = static_cast<const cuda::bf16*>(a->get());
    const auto* b0 = static_cast<const cuda::bf16*>(b->get());
    for (const GemmCallAt& at : calls) {
      cuda::enqueue_gemm(handle, at.call, a0 + at.a, b0 + at.b, c->bytes() + at.c * c_width);
    }
  };
}

// An attention launch's shape, sizes and random bf16 q, k and v (seeds seed..seed + 2), as
// the plain and the ring attention closures both start.
struct AttentionOperands {
  kernels::AttentionShape shape;
  int64_t q_elements = 0, kv_elements = 0, rows = 0;  // rows: batch x heads x seq
  Buffer q, k, v;
};

AttentionOperands attention_operands(const AttentionLaunch& a, uint64_t seed) {
  const int64_t q_elements = a.batch * a.seq * a.heads * a.head_dim;
  const int64_t kv_elements = a.batch * a.seq * a.kv_heads * a.head_dim;
  return {.shape = {.batch = a.batch,
                    .seq = a.seq,
                    .heads = a.heads,
                    .kv_heads = a.kv_heads,
                    .head_dim = a.head_dim},
          .q_elements = q_elements,
          .kv_elements = kv_elements,
          .rows = a.batch * a.heads * a.seq,
          .q = random_operands(DType::kBf16, q_elements, seed),
          .k = random_operands(DType::kBf16, kv_elements, seed + 1),
          .v = random_operands(DType::kBf16, kv_elements, seed + 2)};
}

// The attention dhelix-run runs, on random bf16 operands: cuDNN's fused SDPA when the same
// decision dhelix-run makes at set-up (runtime/cuda/attention_path.h, made here once per
// shape by `choose`) picks it, else runtime/cuda's kernels. `sdpa` outlives the closure.
Enqueue attention_closure(const OpLaunchPlan& plan, uint64_t seed, cuda::CudnnSdpa* sdpa) {
  const AttentionLaunch& a = plan.attention;
  const AttentionOperands ops = attention_operands(a, seed);
  const kernels::AttentionShape& shape = ops.shape;
  const int64_t q_elements = ops.q_elements, kv_elements = ops.kv_elements, rows = ops.rows;
  const Buffer &q = ops.q, &k = ops.k, &v = ops.v;
  Buffer out = zeroed(q_elements * 2);
  Buffer lse = zeroed(rows * 4);
  const int64_t workspace_bytes = sdpa != nullptr ? sdpa->workspace_bytes(shape) : 0;
  // Read inside every closure below, so each holds it: it lives as long as they do.
  Buffer workspace = zeroed(workspace_bytes);
  using cuda::bf16;
  const auto as = [](const Buffer& b) { return static_cast<bf16*>(b->get()); };
  const auto f32 = [](const Buffer& b) { return static_cast<float*>(b->get()); };
  const auto forward = [=](cudaStream_t stream) {
    const cuda::Workspace ws{workspace->get(), workspace_bytes};
    if (sdpa != nullptr) {
      sdpa->forward(shape, as(q), as(k), as(v), as(out), f32(lse), ws, stream);
    } else {
      cuda::attention_forward(shape, as(q), as(k), as(v), as(out), f32(lse), stream);
    }
  };
  if (!a.backward) return forward;
  // The backward reads the forward's out and lse: computed once here.
  forward(nullptr);
  DHELIX_CUDA(cudaDeviceSynchronize());
  Buffer dout = random_operands(DType::kBf16, q_elements, seed + 3);
  Buffer dq = zeroed(q_elements * 2), dk = zeroed(kv_elements * 2), dv = zeroed(kv_elements * 2);
  Buffer delta = zeroed(rows * 4);
  return [=](cudaStream_t stream) {
    const cuda::Workspace ws{workspace->get(), workspace_bytes};
    if (sdpa != nullptr) {
      sdpa->backward(shape, as(q), as(k), as(v), as(out), f32(lse), as(dout), as(dq), as(dk),
                     as(dv), f32(delta), ws, stream);
    } else {
      cuda::attention_backward(shape, as(q), as(k), as(v), as(out), f32(lse), as(dout), as(dq),
                               as(dk), as(dv), f32(delta), stream);
    }
  };
}

// One CP ring step as the runtime runs it (runtime/cuda/ring_attention_cuda.h), on random
// bf16 operands: CP 2, rank 0, visiting its own block (step 0) or rank 1's (cuda_op_plan.h).
// The backward's lse and delta come from a whole forward over both blocks, computed once.
Enqueue ring_step_closure(const OpLaunchPlan& plan, uint64_t seed) {
  const AttentionLaunch& a = plan.attention;
  const AttentionOperands ops = attention_operands(a, seed);
  const kernels::AttentionShape& shape = ops.shape;
  const int64_t q_elements = ops.q_elements, kv_elements = ops.kv_elements, rows = ops.rows;
  const Buffer &q = ops.q, &k = ops.k, &v = ops.v;
  const cpu::RingStep step{
      .cp = 2, .rank = 0, .block_rank = a.diagonal ? 0 : 1, .chunk = a.seq / 2};
  Buffer stats = zeroed(cuda::ring_state_stats_elements(shape) * 4);
  Buffer acc = zeroed(cuda::ring_state_acc_elements(shape) * 4);
  using cuda::bf16;
  const auto as = [](const Buffer& b) { return static_cast<bf16*>(b->get()); };
  const auto f32 = [](const Buffer& b) { return static_cast<float*>(b->get()); };
  const cuda::RingDeviceState state{.stats = f32(stats), .acc = f32(acc)};
  if (!a.backward) {
    cuda::ring_forward_start(shape, state, nullptr);
    DHELIX_CUDA(cudaDeviceSynchronize());  // the closure runs on another stream
    return [=](cudaStream_t stream) {
      cuda::ring_forward_step(shape, step, as(q), as(k), as(v), state, stream);
    };
  }
  Buffer out = zeroed(q_elements * 2), lse = zeroed(rows * 4), delta = zeroed(rows * 4);
  Buffer dout = random_operands(DType::kBf16, q_elements, seed + 3);
  Buffer dq = zeroed(q_elements * 2), dk = zeroed(kv_elements * 2), dv = zeroed(kv_elements * 2);
  cuda::ring_forward_start(shape, state, nullptr);
  for (int64_t block = 0; block < 2; ++block) {
    cuda::ring_forward_step(shape, {.cp = 2, .rank = 0, .block_rank = block, .chunk = a.seq / 2},
                            as(q), as(k), as(v), state, nullptr);
  }
  cuda::ring_forward_finish(shape, state, as(out), f32(lse), nullptr);
  cuda::ring_backward_delta(shape, as(out), as(dout), f32(delta), nullptr);
  DHELIX_CUDA(cudaDeviceSynchronize());
  return [=](cudaStream_t stream) {
    cuda::ring_backward_step(shape, step, as(q), as(dout), f32(lse), f32(delta), as(k), as(v),
                             as(dq), as(dk), as(dv), stream);
  };
}

Enqueue copy_closure(const OpLaunchPlan& plan) {
  Buffer from = zeroed(plan.copy_bytes), to = zeroed(plan.copy_bytes);
  const auto bytes = static_cast<size_t>(plan.copy_bytes);
  return [=](cudaStream_t stream) {
    DHELIX_CUDA(cudaMemcpyAsync(to->get(), from->get(), bytes, cudaMemcpyDeviceToDevice, stream));
  };
}

Enqueue collective_closure(const OpLaunchPlan& plan, ncclComm_t comm) {
  int size = 0, rank = 0;
  DHELIX_NCCL(ncclCommCount(comm, &size));
  DHELIX_NCCL(ncclCommUserRank(comm, &rank));
  DHELIX_CHECK(size == plan.group_size);
  const ncclDataType_t type = nccl_type(plan.dtype);
  const int64_t width = dtype_bytes(plan.dtype);
  const auto count = static_cast<size_t>(plan.elements);
  const size_t share = count / static_cast<size_t>(size);
  const bool gather = plan.kind == LaunchKind::kAllGather;
  const bool scatter = plan.kind == LaunchKind::kReduceScatter;
  Buffer send = zeroed(static_cast<int64_t>(gather ? share : count) * width);
  Buffer recv = zeroed(static_cast<int64_t>(scatter ? share : count) * width);
  const LaunchKind kind = plan.kind;
  return [=](cudaStream_t stream) {
    switch (kind) {
      case LaunchKind::kAllGather:
        DHELIX_NCCL(ncclAllGather(send->get(), recv->get(), share, type, comm, stream));
        return;
      case LaunchKind::kReduceScatter:
        DHELIX_NCCL(
            ncclReduceScatter(send->get(), recv->get(), share, type, ncclSum, comm, stream));
        return;
      case LaunchKind::kAllReduce:
        DHELIX_NCCL(ncclAllReduce(send->get(), recv->get(), count, type, ncclSum, comm, stream));
        return;
      case LaunchKind::kAllToAll:
        DHELIX_NCCL(ncclGroupStart());
        for (int peer = 0; peer < size; ++peer) {
          const size_t at = static_cast<size_t>(peer) * share * static_cast<size_t>(width);
          DHELIX_NCCL(ncclSend(send->bytes() + at, share, type, peer, comm, stream));
          DHELIX_NCCL(ncclRecv(recv->bytes() + at, share, type, peer, comm, stream));
        }
        DHELIX_NCCL(ncclGroupEnd());
        return;
      case LaunchKind::kSendRecv:
        DHELIX_NCCL(ncclGroupStart());
        DHELIX_NCCL(ncclSend(send->get(), count, type, (rank + 1) % size, comm, stream));
        DHELIX_NCCL(ncclRecv(recv->get(), count, type, (rank + size - 1) % size, comm, stream));
        DHELIX_NCCL(ncclGroupEnd());
        return;
      case LaunchKind::kGemm:
      case LaunchKind::kCopy:
      case LaunchKind::kAttention:
        break;
    }
    DHELIX_CHECK_MSG(false, std::string("not a collective launch: ") + launch_kind_name(kind));
  };
}

// One NCCL communicator of the group `setup` describes, over the MPI communicator `group`.
ncclComm_t init_nccl(const NcclGroupSetup& setup, MPI_Comm group) {
  ncclUniqueId id{};
  if (setup.key == 0) DHELIX_NCCL(ncclGetUniqueId(&id));
  rt::check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group), "MPI_Bcast");
  // The runtime's configuration for the dimension (maxCTAs of pipeline channels).
  cuda::CommId shared{};
  static_assert(sizeof shared == sizeof id);
  std::memcpy(shared.data(), &id, sizeof id);
  return reinterpret_cast<ncclComm_t>(
      cuda::nccl_comm_init(shared, setup.size, setup.key, setup.max_ctas));
}

}  // namespace

CudaOpRunner::CudaOpRunner(const Placement& placement, const std::vector<ParallelDim>& dims,
                           int64_t rank, MPI_Comm world)
    : rank_(rank) {
  DHELIX_CUBLAS(cublasCreate(&cublas_));
  try {
    // The runtime's handle settings, workspace included (cublas_gemm.h).
    DHELIX_CUDA(cudaMalloc(&cublas_workspace_, static_cast<size_t>(cuda::kCublasWorkspaceBytes)));
    cuda::configure_gemm_handle(cublas_, cublas_workspace_, cuda::kCublasWorkspaceBytes);
    for (const NcclGroupSetup& setup : nccl_group_setups(placement, dims, rank)) {
      MPI_Comm group = MPI_COMM_NULL;
      rt::check_mpi(
          MPI_Comm_split(world, static_cast<int>(setup.root), static_cast<int>(setup.key), &group),
          "MPI_Comm_split");
      std::array<ncclComm_t, 2>& strands = comms_[setup.dim];
      strands = {nullptr, nullptr};
      try {
        for (ncclComm_t& comm : strands) comm = init_nccl(setup, group);
      } catch (...) {
        (void)MPI_Comm_free(&group);
        throw;
      }
      rt::check_mpi(MPI_Comm_free(&group), "MPI_Comm_free");
    }
  } catch (...) {
    release();  // no destructor runs for a half-made object
    throw;
  }
}

CudaOpRunner::~CudaOpRunner() { release(); }

void CudaOpRunner::release() noexcept {
  // Runs in the destructor: failures while tearing down are ignored.
  (void)cudaDeviceSynchronize();
  for (auto& [dim, strands] : comms_) {
    for (ncclComm_t& comm : strands) {
      if (comm != nullptr) (void)ncclCommDestroy(comm);
      comm = nullptr;
    }
  }
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  cublas_ = nullptr;
  if (cublas_workspace_ != nullptr) (void)cudaFree(cublas_workspace_);
  cublas_workspace_ = nullptr;
}

cuda::CudnnSdpa* CudaOpRunner::attention_for(const AttentionLaunch& a) {
  const kernels::AttentionShape shape{.batch = a.batch,
                                      .seq = a.seq,
                                      .heads = a.heads,
                                      .kv_heads = a.kv_heads,
                                      .head_dim = a.head_dim};
  const auto key = std::tuple{a.batch, a.seq, a.heads, a.kv_heads, a.head_dim};
  auto found = attention_paths_.find(key);
  if (found == attention_paths_.end()) {
    if (!sdpa_) sdpa_ = cuda::CudnnSdpa::load();
    cuda::AttentionSetup setup;
    setup.shape = shape;
    setup.choice = cuda::parse_attention_choice(std::getenv("DHELIX_ATTENTION"));
    // On a non-blocking stream of its own, as the runtime's set-up runs it on the compute
    // stream (the self-check's buffers are zeroed and filled on that stream:
    // runtime/cuda/stream_scratch.h refuses the legacy one).
    cuda::CudaDeviceApi api;
    const cuda::StreamHandle stream = api.create_stream(/*high_priority=*/false);
    const struct Release {
      cuda::CudaDeviceApi& api;
      cuda::StreamHandle stream;
      ~Release() { api.destroy_stream(stream); }
    } release{api, stream};
    const cuda::AttentionDecision decision =
        cuda::prepare_attention_path(api, *sdpa_, setup, stream);
    if (rank_ == 0) {
      std::cerr << fmt::format(
          "dhelix-profile: attention batch {} seq {} heads {}/{} head_dim "
          "{}: {}\n",
          a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, decision.reason);
    }
    found = attention_paths_.emplace(key, decision.path).first;
  }
  return found->second == cuda::AttentionPath::kCudnn ? sdpa_.get() : nullptr;
}

ncclComm_t CudaOpRunner::communicator(ParallelDim dim, int strand) const {
  const auto found = comms_.find(dim);
  DHELIX_CHECK_MSG(found != comms_.end(),
                   std::string("no communicator for ") + parallel_dim_name(dim));
  DHELIX_CHECK(strand == 0 || strand == 1);
  return found->second[static_cast<size_t>(strand)];
}

CudaRunnableOp CudaOpRunner::make(const Op& op, int strand) {
  const OpLaunchPlan plan = plan_cuda_op(op);
  CudaRunnableOp runnable{.enqueue = {}, .plan = plan};
  switch (plan.kind) {
    case LaunchKind::kGemm:
      runnable.enqueue = gemm_closure(cublas_, plan, next_seed_);
      next_seed_ += 2;
      break;
    case LaunchKind::kCopy:
      runnable.enqueue = copy_closure(plan);
      break;
    case LaunchKind::kAttention:
      // A ring step runs the ring kernel whatever cuDNN does for causal attention.
      runnable.enqueue = plan.attention.ring_step
                             ? ring_step_closure(plan, next_seed_)
                             : attention_closure(plan, next_seed_, attention_for(plan.attention));
      next_seed_ += 4;
      break;
    default:
      runnable.enqueue = collective_closure(plan, communicator(op.group, strand));
      break;
  }
  return runnable;
}

}  // namespace dhelix::cuda_profile
