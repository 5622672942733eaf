#include "runtime/cuda/attention_self_check.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/stream_scratch.h"

namespace dhelix::cuda {
namespace {

// Device memory of the self-check, zeroed on its stream, freed when it goes.
using Buffer = StreamScratch;

// One path's outputs for the self-check shape.
struct Outputs {
  Buffer out, lse, dq, dk, dv, delta;
  Outputs(DeviceApi& api, StreamHandle stream, int64_t q_count, int64_t kv_count, int64_t rows)
      : out(api, q_count * 2, stream),
        lse(api, rows * 4, stream),
        dq(api, q_count * 2, stream),
        dk(api, kv_count * 2, stream),
        dv(api, kv_count * 2, stream),
        delta(api, rows * 4, stream) {}
};

cudaStream_t cuda_of(StreamHandle stream) { return reinterpret_cast<cudaStream_t>(stream); }

// A copy on `stream`, waited for: the host vector must stay valid until it is done.
void copy_on(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, StreamHandle stream) {
  DHELIX_CUDA(cudaMemcpyAsync(to, from, bytes, kind, cuda_of(stream)));
  DHELIX_CUDA(cudaStreamSynchronize(cuda_of(stream)));
}

void upload_inputs(const Buffer& buffer, int64_t count, int64_t salt, StreamHandle stream) {
  std::vector<__nv_bfloat16> host(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    host[static_cast<size_t>(i)] = __float2bfloat16(self_check_input(salt, i));
  }
  copy_on(buffer.as<void>(), host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice,
          stream);
}

std::vector<float> download_bf16(const Buffer& buffer, int64_t count, StreamHandle stream) {
  std::vector<__nv_bfloat16> raw(static_cast<size_t>(count));
  copy_on(raw.data(), buffer.as<void>(), raw.size() * sizeof(raw[0]), cudaMemcpyDeviceToHost,
          stream);
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

std::vector<float> download_f32(const Buffer& buffer, int64_t count, StreamHandle stream) {
  std::vector<float> out(static_cast<size_t>(count));
  copy_on(out.data(), buffer.as<void>(), out.size() * sizeof(float), cudaMemcpyDeviceToHost,
          stream);
  return out;
}

bool same_bits(const Buffer& a, const Buffer& b, StreamHandle stream) {
  std::vector<char> x(static_cast<size_t>(a.bytes())), y(static_cast<size_t>(b.bytes()));
  copy_on(x.data(), a.as<void>(), x.size(), cudaMemcpyDeviceToHost, stream);
  copy_on(y.data(), b.as<void>(), y.size(), cudaMemcpyDeviceToHost, stream);
  return x == y;
}

// The self-check of step 3 into `facts`.
void self_check(DeviceApi& api, CudnnSdpa& sdpa, const AttentionSetup& setup, StreamHandle handle,
                AttentionFacts& facts) {
  const cudaStream_t stream = cuda_of(handle);
  const kernels::AttentionShape s = self_check_shape(setup.shape);
  const int64_t q_count = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_count = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  Buffer q(api, q_count * 2, handle), k(api, kv_count * 2, handle), v(api, kv_count * 2, handle),
      dout(api, q_count * 2, handle);
  upload_inputs(q, q_count, 0, handle);
  upload_inputs(k, kv_count, 1, handle);
  upload_inputs(v, kv_count, 2, handle);
  upload_inputs(dout, q_count, 3, handle);
  Outputs mine(api, handle, q_count, kv_count, rows), theirs(api, handle, q_count, kv_count, rows);
  Buffer workspace(api, sdpa.workspace_bytes(s), handle);
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
  facts.outputs = {compare_attention_outputs("out", download_bf16(theirs.out, q_count, handle),
                                             download_bf16(mine.out, q_count, handle)),
                   compare_attention_outputs("lse", download_f32(theirs.lse, rows, handle),
                                             download_f32(mine.lse, rows, handle)),
                   compare_attention_outputs("dq", download_bf16(theirs.dq, q_count, handle),
                                             download_bf16(mine.dq, q_count, handle)),
                   compare_attention_outputs("dk", download_bf16(theirs.dk, kv_count, handle),
                                             download_bf16(mine.dk, kv_count, handle)),
                   compare_attention_outputs("dv", download_bf16(theirs.dv, kv_count, handle),
                                             download_bf16(mine.dv, kv_count, handle))};
  if (setup.deterministic) {
    Outputs again(api, handle, q_count, kv_count, rows);
    cudnn_backward(again);
    DHELIX_CUDA(cudaStreamSynchronize(stream));
    facts.backward_repeatable = same_bits(again.dq, theirs.dq, handle) &&
                                same_bits(again.dk, theirs.dk, handle) &&
                                same_bits(again.dv, theirs.dv, handle);
  }
}

bool same_shape(const kernels::AttentionShape& a, const kernels::AttentionShape& b) {
  return a.batch == b.batch && a.seq == b.seq && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim;
}

// Runs the job shape's plans once on zeroed buffers: the self-check ran only its own
// shape's, and a kernel loaded at its first launch inside iteration 1, with receives posted,
// is the hang of docs/gpu.md ("Review", point 1).
void warm_up(DeviceApi& api, CudnnSdpa& sdpa, const kernels::AttentionShape& s,
             StreamHandle handle) {
  const cudaStream_t stream = cuda_of(handle);
  const int64_t q_count = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kv_count = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t rows = s.batch * s.heads * s.seq;
  Buffer q(api, q_count * 2, handle), k(api, kv_count * 2, handle), v(api, kv_count * 2, handle),
      dout(api, q_count * 2, handle);
  Outputs o(api, handle, q_count, kv_count, rows);
  Buffer workspace(api, sdpa.workspace_bytes(s), handle);
  const Workspace ws{workspace.as<void>(), workspace.bytes()};
  using B = __nv_bfloat16;
  sdpa.forward(s, q.as<B>(), k.as<B>(), v.as<B>(), o.out.as<B>(), o.lse.as<float>(), ws, stream);
  sdpa.backward(s, q.as<B>(), k.as<B>(), v.as<B>(), o.out.as<B>(), o.lse.as<float>(), dout.as<B>(),
                o.dq.as<B>(), o.dk.as<B>(), o.dv.as<B>(), o.delta.as<float>(), ws, stream);
  DHELIX_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace

AttentionDecision prepare_attention_path(DeviceApi& api, CudnnSdpa& sdpa,
                                         const AttentionSetup& setup, StreamHandle stream) {
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
      self_check(api, sdpa, setup, stream, facts);
    } catch (const Error& error) {
      facts.refusal = fmt::format("the self-check's run failed: {}", error.what());
    }
  }
  AttentionDecision decision = decide_attention_path(setup, facts);
  if (decision.path == AttentionPath::kCudnn && !same_shape(check, setup.shape)) {
    try {
      warm_up(api, sdpa, setup.shape, stream);
    } catch (const Error& error) {
      facts.refusal = fmt::format("the warm-up run of the job's shape failed: {}", error.what());
      decision = decide_attention_path(setup, facts);
    }
  }
  return decision;
}

}  // namespace dhelix::cuda
