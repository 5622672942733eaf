#pragma once
// Which attention a rank runs: cuDNN's fused SDPA graph (sdpa_graph.h, cudnn_sdpa.h) or
// dhelix's own flash kernel (kernels_cuda.h), decided once at set-up, before any receive is
// posted, and then used by every attention of dhelix-run and by dhelix-profile's timing of
// attention (the profiler asks the same question through the same function).
//
// The cuDNN path has never run here (no GPU in the project or its CI), so it is trusted
// only after it proves itself on the rank's own GPU:
//   1. cuDNN present: built with it (DHELIX_WITH_CUDNN) and libcudnn loadable at run time
//      with major version 9 (cudnnGetVersion); otherwise dhelix's kernel.
//   2. cuDNN accepts the graph: some engine of its heuristics finalizes both the forward
//      and the backward plan for the job's shape; under --verify only engines without
//      CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC and the backward without the fp32 dQ
//      accumulator (sdpa_graph.h). Otherwise dhelix's kernel, naming the refusal.
//   3. the self-check: forward and backward once on a small problem of the job's head shape
//      (batch 1, seq min(job seq, 128), the job's heads, kv_heads, head_dim) from fixed
//      inputs, on both paths; every output of cuDNN must agree with dhelix's to within
//      kSelfCheckTolerance of that output's largest magnitude (compare_attention_outputs),
//      and under --verify a second cuDNN backward must give the same bits. Otherwise
//      dhelix's kernel, naming the output, the element and both values.
// DHELIX_ATTENTION=cudnn|dhelix|auto (default auto) forces a path: `dhelix` skips cuDNN
// altogether; `cudnn` makes steps 1-2 errors instead of fallbacks and uses cuDNN even when
// the self-check disagrees (it still prints the disagreement), for debugging on a cluster.
// Every rank prints the path it took, once (dhelix-run's "attention:" lines, one per kind
// of attention its layers run: attention_summary).
//
// Under context parallelism the kinds differ: Ulysses (cp_comm_type a2a) runs plain causal
// attention on a head split, decided as above on that shape; the ring types (p2p,
// allgather, a2a+p2p) run ring steps whose queries and keys sit at different positions,
// always on dhelix's tensor-core ring kernel (ring_attention_cuda.h): the cuDNN graph here
// (sdpa_graph.h) is causal self-attention and has no offset band for a ring step.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/parallel_spec.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

/// DHELIX_ATTENTION's values.
enum class AttentionChoice { kAuto, kCudnn, kDhelix };
/// The attention that runs.
enum class AttentionPath { kCudnn, kDhelix };

/// Parses DHELIX_ATTENTION (nullptr or "" = auto). Throws Error(kInvalidInput) naming the
/// variable, the value and the allowed values.
AttentionChoice parse_attention_choice(const char* value);
const char* attention_path_name(AttentionPath path);  ///< "cudnn", "dhelix"

/// What a rank's set-up asks for (DeviceApi::prepare_attention).
struct AttentionSetup {
  kernels::AttentionShape shape;  ///< one micro-batch on this rank (batch = micro-batch)
  bool deterministic = false;     ///< --verify: bitwise reproducible results required
  AttentionChoice choice = AttentionChoice::kAuto;
};

/// The self-check problem for a job's shape: batch 1, seq min(seq, 128), same heads.
kernels::AttentionShape self_check_shape(const kernels::AttentionShape& job);
/// The self-check's fixed input value for element `index` of tensor `salt` (q 0, k 1, v 2,
/// dout 3): in [-1, 1], the same on every path and every rank.
float self_check_input(int64_t salt, int64_t index);

/// Largest |cudnn - dhelix| allowed, as a fraction of the output's largest |dhelix| value:
/// 1/32, i.e. 4 to 8 bf16 units in the last place at that magnitude (8 significant bits; each path
/// rounds its output to bf16 once and cuDNN also rounds P and dS to bf16 before their
/// matmuls, the reason for the margin). A wrong mask, scale, transpose or head mapping gives
/// errors of order 1.
inline constexpr double kSelfCheckTolerance = 1.0 / 32.0;

/// One output compared (values as float, same length).
struct OutputComparison {
  std::string name;
  double max_error = 0.0;  ///< max |a - b| / max |b| (1 when any value is not finite)
  int64_t worst = -1;      ///< its element
  float cudnn_value = 0.0f;
  float dhelix_value = 0.0f;
  bool agrees = true;
};
OutputComparison compare_attention_outputs(const std::string& name, const std::vector<float>& cudnn,
                                           const std::vector<float>& dhelix);

/// What the set-up learned about cuDNN on this rank.
struct AttentionFacts {
  bool built_with_cudnn = false;
  int64_t cudnn_version = 0;                ///< cudnnGetVersion(); 0: not loadable
  std::optional<std::string> refusal;       ///< step 2's failure, in cuDNN's words
  std::vector<OutputComparison> outputs;    ///< step 3: out, lse, dq, dk, dv
  std::optional<bool> backward_repeatable;  ///< step 3 under --verify
};

/// The decision and its one-line reason (printed by every rank).
struct AttentionDecision {
  AttentionPath path = AttentionPath::kDhelix;
  std::string reason;
  bool operator==(const AttentionDecision&) const = default;
};

/// Whether steps 2-3 should run at all (cuDNN present and not declined). Throws
/// Error(kUnsupported) when DHELIX_ATTENTION=cudnn but cuDNN is absent.
bool should_try_cudnn(const AttentionSetup& setup, const AttentionFacts& facts);
/// The decision from the facts of steps 1-3. Throws Error(kUnsupported) when
/// DHELIX_ATTENTION=cudnn but cuDNN refused the graph.
AttentionDecision decide_attention_path(const AttentionSetup& setup, const AttentionFacts& facts);

/// One line per attention kind a rank's layers run, naming its engine and, where cuDNN
/// was not taken, why: `causal` is the decision for the attention prepared at set-up
/// (nullopt when none was: ring steps only, or no layers), cp and cp_comm_type the job's.
std::vector<std::string> attention_summary(const std::optional<AttentionDecision>& causal,
                                           int64_t cp, CpCommType cp_comm_type);

}  // namespace dhelix::cuda
