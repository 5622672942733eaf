#include "runtime/train/moe_support.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {

namespace {

// The CUDA backend's MoE layers (runtime/model/moe_layers_padded.h) run every routed-expert
// setting the CPU's do (EP, tensor and expert tensor parallelism, CP, recompute, dropless
// routing padded to T rows); the shared expert is refused by name.
template <class Refuse>
void refuse_on_device(const JobSpec& job, const std::string& layers, const std::string& backend,
                      const Refuse& refuse) {
  if (job.model.moe->shared_expert_ffn_hidden_size > 0) {
    refuse(fmt::format("{} with a shared expert on the {} backend", layers, backend),
           "use --backend cpu");
  }
}

}  // namespace

void refuse_unsupported_moe(const JobSpec& job, const std::string& plan_file,
                            const std::string& backend) {
  const ParallelSpec& p = job.parallel;
  auto refuse = [&](const std::string& what, const std::string& advice) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: dhelix-run does not run {} yet; {}", plan_file, what, advice));
  };
  const auto& moe = job.model.moe;
  if (!moe) {
    if (p.ep > 1)
      refuse(fmt::format("expert parallelism (ep = {})", p.ep), "plan the job without it");
    return;
  }
  const std::string layers = fmt::format("mixture-of-experts layers ({} experts, top-{}, ep = {})",
                                         moe->num_experts, moe->top_k, p.ep);
  if (backend != "cpu") refuse_on_device(job, layers, backend, refuse);
  if (moe->shared_expert_ffn_hidden_size % p.tp != 0) {
    refuse(fmt::format("{} with a shared expert of width {} that tp = {} does not divide", layers,
                       moe->shared_expert_ffn_hidden_size, p.tp),
           "plan the job with a tp that divides moe.shared_expert_ffn_hidden_size");
  }
}

}  // namespace dhelix::rt
