#include "runtime/cuda/attention_path.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

constexpr int64_t kSelfCheckMaxSeq = 128;

std::string version_text(int64_t version) {
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

// The first output that disagrees, in words.
std::optional<std::string> disagreement(const std::vector<OutputComparison>& outputs) {
  for (const OutputComparison& o : outputs) {
    if (o.agrees) continue;
    return fmt::format(
        "the self-check's {} differs: element {} is {} on cuDNN and {} on dhelix's kernel "
        "(error {:.3g} of the largest value, tolerance {:.3g})",
        o.name, o.worst, o.cudnn_value, o.dhelix_value, o.max_error, kSelfCheckTolerance);
  }
  return std::nullopt;
}

}  // namespace

AttentionChoice parse_attention_choice(const char* value) {
  if (value == nullptr || std::strcmp(value, "") == 0 || std::strcmp(value, "auto") == 0) {
    return AttentionChoice::kAuto;
  }
  if (std::strcmp(value, "cudnn") == 0) return AttentionChoice::kCudnn;
  if (std::strcmp(value, "dhelix") == 0) return AttentionChoice::kDhelix;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("DHELIX_ATTENTION={}: expected auto, cudnn or dhelix", value));
}

const char* attention_path_name(AttentionPath path) {
  return path == AttentionPath::kCudnn ? "cudnn" : "dhelix";
}

kernels::AttentionShape self_check_shape(const kernels::AttentionShape& job) {
  kernels::AttentionShape shape = job;
  shape.batch = 1;
  shape.seq = std::min(job.seq, kSelfCheckMaxSeq);
  return shape;
}

float self_check_input(int64_t salt, int64_t index) {
  // A 32-bit integer hash (multiply, xor-shift), mapped to [-1, 1] in steps of 1/1024 so
  // that every input is exact in bf16.
  uint32_t x = static_cast<uint32_t>(index) * 2654435761u + static_cast<uint32_t>(salt) * 40503u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(static_cast<int32_t>(x % 2049u) - 1024) / 1024.0f;
}

OutputComparison compare_attention_outputs(const std::string& name, const std::vector<float>& cudnn,
                                           const std::vector<float>& dhelix) {
  DHELIX_CHECK(cudnn.size() == dhelix.size());
  OutputComparison result;
  result.name = name;
  double scale = 0.0;
  for (float v : dhelix) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  if (scale == 0.0 || !std::isfinite(scale)) scale = 1.0;
  for (size_t i = 0; i < cudnn.size(); ++i) {
    const double error = std::isfinite(cudnn[i]) && std::isfinite(dhelix[i])
                             ? std::fabs(static_cast<double>(cudnn[i]) - dhelix[i]) / scale
                             : 1.0;
    if (result.worst < 0 || error > result.max_error) {
      result.max_error = error;
      result.worst = static_cast<int64_t>(i);
      result.cudnn_value = cudnn[i];
      result.dhelix_value = dhelix[i];
    }
  }
  result.agrees = result.max_error <= kSelfCheckTolerance;
  return result;
}

bool should_try_cudnn(const AttentionSetup& setup, const AttentionFacts& facts) {
  if (setup.choice == AttentionChoice::kDhelix) return false;
  const bool present = facts.built_with_cudnn && facts.cudnn_version / 10000 == 9;
  if (!present && setup.choice == AttentionChoice::kCudnn) {
    throw Error(ErrorCode::kUnsupported,
                !facts.built_with_cudnn
                    ? std::string("DHELIX_ATTENTION=cudnn: this dhelix was built without cuDNN "
                                  "(cmake found no cudnn_graph.h; DHELIX_WITH_CUDNN is off)")
                : facts.cudnn_version == 0
                    ? std::string("DHELIX_ATTENTION=cudnn: libcudnn could not be loaded")
                    : fmt::format("DHELIX_ATTENTION=cudnn: cuDNN {} is loaded; dhelix needs 9.x",
                                  version_text(facts.cudnn_version)));
  }
  return present;
}

AttentionDecision decide_attention_path(const AttentionSetup& setup, const AttentionFacts& facts) {
  if (setup.choice == AttentionChoice::kDhelix) {
    return {AttentionPath::kDhelix, "dhelix's kernel (DHELIX_ATTENTION=dhelix)"};
  }
  if (!should_try_cudnn(setup, facts)) {
    return {AttentionPath::kDhelix,
            !facts.built_with_cudnn    ? "dhelix's kernel (built without cuDNN)"
            : facts.cudnn_version == 0 ? "dhelix's kernel (libcudnn not loadable)"
                                       : fmt::format("dhelix's kernel (cuDNN {} is not 9.x)",
                                                     version_text(facts.cudnn_version))};
  }
  const std::string cudnn = fmt::format("cuDNN {}", version_text(facts.cudnn_version));
  if (facts.refusal) {
    if (setup.choice == AttentionChoice::kCudnn) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("DHELIX_ATTENTION=cudnn: {} refused the attention graph: {}", cudnn,
                              *facts.refusal));
    }
    return {AttentionPath::kDhelix,
            fmt::format("dhelix's kernel ({} refused the graph: {})", cudnn, *facts.refusal)};
  }
  std::optional<std::string> problem = disagreement(facts.outputs);
  if (facts.outputs.empty()) problem = "the self-check compared nothing";
  if (!problem && setup.deterministic && facts.backward_repeatable != true) {
    problem = "two runs of its backward gave different bits (--verify needs equal bits)";
  }
  if (problem) {
    if (setup.choice == AttentionChoice::kCudnn) {
      return {AttentionPath::kCudnn,
              fmt::format("{} fused SDPA (DHELIX_ATTENTION=cudnn) although {}", cudnn, *problem)};
    }
    return {AttentionPath::kDhelix, fmt::format("dhelix's kernel ({}: {})", cudnn, *problem)};
  }
  double worst = 0.0;
  for (const OutputComparison& o : facts.outputs) worst = std::max(worst, o.max_error);
  return {AttentionPath::kCudnn,
          fmt::format("{} fused SDPA (self-check agreed with dhelix's kernel within {:.2g}{})",
                      cudnn, worst, setup.deterministic ? ", backward repeatable" : "")};
}

std::vector<std::string> attention_summary(const std::optional<AttentionDecision>& causal,
                                           int64_t cp, CpCommType cp_comm_type) {
  std::vector<std::string> lines;
  if (causal) {
    const char* kind = cp > 1 ? "Ulysses head-split attention (cp_comm_type a2a)" : "attention";
    lines.push_back(fmt::format("{}: {}", kind, causal->reason));
  }
  if (cp > 1 && cp_comm_type != CpCommType::kA2a) {
    lines.push_back(fmt::format(
        "ring steps (cp_comm_type {}): dhelix's tensor-core ring kernel; cuDNN not used: a "
        "ring step's queries and keys sit at different positions (an offset causal band), "
        "which dhelix's cuDNN graph (causal self-attention) does not express",
        cp_comm_type_name(cp_comm_type)));
  }
  return lines;
}

}  // namespace dhelix::cuda
