#include "runtime/train/moe_support.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {

void refuse_unsupported_moe(const JobSpec& job, const std::string& plan_file,
                            const std::string& backend) {
  (void)backend;  // both backends run the same MoE settings (moe_support.h)
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
  if (moe->shared_expert_ffn_hidden_size % p.tp != 0) {
    refuse(
        fmt::format("mixture-of-experts layers ({} experts, top-{}, ep = {}) with a shared "
                    "expert of width {} that tp = {} does not divide",
                    moe->num_experts, moe->top_k, p.ep, moe->shared_expert_ffn_hidden_size, p.tp),
        "plan the job with a tp that divides moe.shared_expert_ffn_hidden_size");
  }
}

}  // namespace dhelix::rt
