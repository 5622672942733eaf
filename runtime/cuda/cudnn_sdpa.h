#pragma once
// cuDNN's fused scaled-dot-product attention for dhelix's causal GQA attention, through
// cuDNN 9's backend graph API (cudnn_graph.h): the graph of sdpa_graph.h turned into
// descriptors, the first engine of cuDNN's heuristics (mode A, then FALLBACK) whose plan
// finalizes, and the plan cached per shape and direction.
//
// Failure rules.
//   * The library is opened at run time (dlopen of libcudnn_graph.so.9), so a binary built
//     with cuDNN still runs on a node without it: load() then reports version 0 and
//     attention_path.h picks dhelix's kernel. Built without cuDNN (cmake found no
//     cudnn_graph.h, DHELIX_WITH_CUDNN off), load() reports the same.
//   * prepare() never throws for cuDNN refusing the graph (no engine, a status other than
//     success while building or finalizing): it returns the refusal in words, naming the
//     call and cuDNN's status name and last error text; the caller falls back.
//   * Every other cuDNN call (execute, descriptor set-up after a plan exists) goes through
//     one wrapper, check_cudnn, which throws Error(kInternal) "<call> failed:
//     <CUDNN_STATUS_...>: <cuDNN's last error> (<file>:<line>)".
//   * forward()/backward() run only shapes prepare() accepted (has_plans); the engine asks
//     before calling and otherwise runs dhelix's kernel, so no plan is ever built (and no
//     kernel compiled at run time) after set-up, inside an iteration with receives posted.
// Workspace comes from dhelix's device pool: the engine sizes its per-stream workspace with
// workspace_bytes() (the larger plan's workspace, plus the backward's fp32 dQ accumulator
// when it has one, 256-byte aligned) and passes it in.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/cuda/kernels_cuda.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

class CudnnSdpa {
 public:
  /// Opens cuDNN if this build has it and the node can load it; never throws.
  static std::unique_ptr<CudnnSdpa> load();
  virtual ~CudnnSdpa() = default;

  /// Whether this build was compiled with cuDNN's headers (DHELIX_WITH_CUDNN).
  static bool built_with_cudnn();
  /// cudnnGetVersion() of the loaded library (e.g. 91900); 0 when none is loaded.
  virtual int64_t version() const = 0;

  /// Builds and caches the forward and backward plans of `shape` (bf16, causal, GQA). The
  /// refusal in words when cuDNN cannot; nullopt when both plans are ready.
  /// deterministic: the backward without the fp32 dQ accumulator and only engines without
  /// CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC.
  virtual std::optional<std::string> prepare(const kernels::AttentionShape& shape,
                                             bool deterministic) = 0;
  /// Whether prepare() accepted `shape`.
  virtual bool has_plans(const kernels::AttentionShape& shape) const = 0;
  /// Workspace bytes forward and backward of a prepared `shape` need (0 for others).
  virtual int64_t workspace_bytes(const kernels::AttentionShape& shape) const = 0;

  /// Enqueues the forward on `stream`: out (bf16) and lse (fp32 [batch, heads, seq]), the
  /// layouts of runtime/kernels/attention.h.
  virtual void forward(const kernels::AttentionShape& shape, const __nv_bfloat16* q,
                       const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                       float* lse, const Workspace& workspace, cudaStream_t stream) = 0;
  /// Enqueues the backward: dq, dk, dv overwritten; delta (fp32 [batch, heads, seq]) is
  /// written with dout . out.
  virtual void backward(const kernels::AttentionShape& shape, const __nv_bfloat16* q,
                        const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* out,
                        const float* lse, const __nv_bfloat16* dout, __nv_bfloat16* dq,
                        __nv_bfloat16* dk, __nv_bfloat16* dv, float* delta,
                        const Workspace& workspace, cudaStream_t stream) = 0;
};

struct SdpaGraph;
/// Makes and finalizes every tensor, node and the operation graph of `graph` with cuDNN's
/// library, which checks each node's shapes and types then; needs no GPU (the GPU-free half
/// of prepare(), for tests). The first failure in words; *loaded: whether a cuDNN 9 library
/// was found at all (false also in a build without cuDNN).
std::optional<std::string> check_graph_descriptors(const SdpaGraph& graph, bool* loaded);

/// A CudnnSdpa for a node or build without cuDNN: version 0, prepare() returns `why`,
/// nothing has plans (cudnn_sdpa_missing.cc).
std::unique_ptr<CudnnSdpa> missing_cudnn(std::string why);

}  // namespace dhelix::cuda
