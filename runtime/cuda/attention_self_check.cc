#include "runtime/cuda/attention_self_check.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels_cuda.h"

namespace dhelix::cuda {
namespace {

// Device memory of the self-check, freed when it goes.
class Buffer {
 public:
  explicit Buffer(int64_t bytes) : bytes_(std::max<int64_t>(bytes, 1)) {
    DHELIX_CUDA(cudaMalloc(&data_, static_cast<size_t>(bytes_)));
    DHELIX_CUDA(cudaMemset(data_, 0, static_cast<size_t>(bytes_)));
  }
  ~Buffer() { static_cast<void>(cudaFree(data_)); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_;
};

// One path's outputs for the self-check shape.
struct Outputs {
  Buffer out, lse, dq, dk, dv, delta;
  Outputs(int64_t q_count, int64_t kv_count, int64_t rows)
      : out(q_count * 2),
        lse(rows * 4),
        dq(q_count * 2),
        dk(kv_count * 2),
        dv(kv_count * 2),
        delta(rows * 4) {}
};

void upload_inputs(const Buffer& buffer, int64_t count, int64_t salt) {
  std::vector<__nv_bfloat16> host(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    host[static_cast<size_t>(i)] = __float2bfloat16(self_check_input(salt, i));
  }
  DHELIX_CUDA(cudaMemcpy(buffer.as<void>(), host.data(), host.size() * sizeof(host[0]),
                         cudaMemcpyHostToDevice));
}

std::vector<float> download_bf16(const Buffer& buffer, int64_t count) {
  std::vector<__nv_bfloat16> raw(static_cast<size_t>(count));
  DHELIX_CUDA(cudaMemcpy(raw.data(), buffer.as<void>(), raw.size() * sizeof(raw[0]),
                         cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

std::vector<float> download_f32(const Buffer& buffer, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  DHELIX_CUDA(cudaMemcpy(out.data(), buffer.as<void>(), out.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
  return out;
}

bool same_bits(const Buffer& a, const Buffer& b) {
  std::vector<char> x(static_cast<size_t>(a.bytes())), y(static_cast<size_t>(b.bytes()));
  DHELIX_CUDA(cudaMemcpy(x.data(), a.as<void>(), x.size(), cudaMemcpyDeviceToHost));
  DHELIX_CUDA(cudaMemcpy(y.data(), b.as<void>(), y.size(), cudaMemcpyDeviceToHost));
  return x == y;
}

// The self-check of step 3 into `facts`.
void self_check(CudnnSdpa& sdpa, const AttentionSetup& setup, cudaStream_t stream,
                AttentionFacts& facts) {
  const kernels::AttentionShape s = self_check_shape(setup.shape);
  const int64_t q_count = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_count = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  Buffer q(q_count * 2), k(kv_count * 2), v(kv_count * 2), dout(q_count * 2);
  upload_inputs(q, q_count, 0);
  upload_inputs(k, kv_count, 1);
  upload_inputs(v, kv_count, 2);
  upload_inputs(dout, q_count, 3);
  Outputs mine(q_count, kv_count, rows), theirs(q_count, kv_count, rows);
  Buffer workspace(sdpa.workspace_bytes(s));
  const Workspace ws{workspace.as<void>(), workspace.bytes()};
  using B = __nv_bfloat16;
  attention_forward(s, q.as<B>(), k.as<B>(), v.as<B>(), mine.out.as<B>(), mine.lse.as<float>(),
                    stream);
  attention_backward(s, q.as<B>(), k.as<B>(), v.as<B>(), mine.out.as<B>(), mine.lse.as<float>(),
                     dout.as<B>(), mine.dq.as<B>(), mine.dk.as<B>(), mine.dv.as<B>(),
                     mine.delta.as<float>(), stream);
  auto cudnn_backward = [&](Outputs& into) {
    sdpa.backward(s, q.as<B>(), k.as<B>(), v.as<B>(), theirs.out.as<B>(), theirs.lse.as<float>(),
                  dout.as<B>(), into.dq.as<B>(), into.dk.as<B>(), into.dv.as<B>(),
                  into.delta.as<float>(), ws, stream);
  };
  sdpa.forward(s, q.as<B>(), k.as<B>(), v.as<B>(), theirs.out.as<B>(), theirs.lse.as<float>(), ws,
               stream);
  cudnn_backward(theirs);
  DHELIX_CUDA(cudaStreamSynchronize(stream));
  facts.outputs = {compare_attention_outputs("out", download_bf16(theirs.out, q_count),
                                             download_bf16(mine.out, q_count)),
                   compare_attention_outputs("lse", download_f32(theirs.lse, rows),
                                             download_f32(mine.lse, rows)),
                   compare_attention_outputs("dq", download_bf16(theirs.dq, q_count),
                                             download_bf16(mine.dq, q_count)),
                   compare_attention_outputs("dk", download_bf16(theirs.dk, kv_count),
                                             download_bf16(mine.dk, kv_count)),
                   compare_attention_outputs("dv", download_bf16(theirs.dv, kv_count),
                                             download_bf16(mine.dv, kv_count))};
  if (setup.deterministic) {
    Outputs again(q_count, kv_count, rows);
    cudnn_backward(again);
    DHELIX_CUDA(cudaStreamSynchronize(stream));
    facts.backward_repeatable = same_bits(again.dq, theirs.dq) && same_bits(again.dk, theirs.dk) &&
                                same_bits(again.dv, theirs.dv);
  }
}

bool same_shape(const kernels::AttentionShape& a, const kernels::AttentionShape& b) {
  return a.batch == b.batch && a.seq == b.seq && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim;
}

// Runs the job shape's plans once on zeroed buffers: the self-check ran only its own
// shape's, and a kernel loaded at its first launch inside iteration 1, with receives posted,
// is the hang of docs/gpu.md ("Review", point 1).
void warm_up(CudnnSdpa& sdpa, const kernels::AttentionShape& s, cudaStream_t stream) {
  const int64_t q_count = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_count = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  Buffer q(q_count * 2), k(kv_count * 2), v(kv_count * 2), dout(q_count * 2);
  Outputs o(q_count, kv_count, rows);
  Buffer workspace(sdpa.workspace_bytes(s));
  const Workspace ws{workspace.as<void>(), workspace.bytes()};
  using B = __nv_bfloat16;
  sdpa.forward(s, q.as<B>(), k.as<B>(), v.as<B>(), o.out.as<B>(), o.lse.as<float>(), ws, stream);
  sdpa.backward(s, q.as<B>(), k.as<B>(), v.as<B>(), o.out.as<B>(), o.lse.as<float>(), dout.as<B>(),
                o.dq.as<B>(), o.dk.as<B>(), o.dv.as<B>(), o.delta.as<float>(), ws, stream);
  DHELIX_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace

AttentionDecision prepare_attention_path(CudnnSdpa& sdpa, const AttentionSetup& setup,
                                         cudaStream_t stream) {
  AttentionFacts facts;
  facts.built_with_cudnn = CudnnSdpa::built_with_cudnn();
  facts.cudnn_version = sdpa.version();
  if (!should_try_cudnn(setup, facts)) return decide_attention_path(setup, facts);
  facts.refusal = sdpa.prepare(setup.shape, setup.deterministic);
  const kernels::AttentionShape check = self_check_shape(setup.shape);
  if (!facts.refusal && !sdpa.has_plans(check)) {
    if (auto refusal = sdpa.prepare(check, setup.deterministic)) {
      facts.refusal = "for the self-check's shape: " + *refusal;
    }
  }
  if (!facts.refusal) {
    try {
      self_check(sdpa, setup, stream, facts);
    } catch (const Error& error) {
      facts.refusal = fmt::format("the self-check's run failed: {}", error.what());
    }
  }
  AttentionDecision decision = decide_attention_path(setup, facts);
  if (decision.path == AttentionPath::kCudnn && !same_shape(check, setup.shape)) {
    try {
      warm_up(sdpa, setup.shape, stream);
    } catch (const Error& error) {
      facts.refusal = fmt::format("the warm-up run of the job's shape failed: {}", error.what());
      decision = decide_attention_path(setup, facts);
    }
  }
  return decision;
}

}  // namespace dhelix::cuda
