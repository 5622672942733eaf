#include "runtime/train/moe_support.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {

namespace {

// The CUDA backend's MoE layers (runtime/model/moe_layers_padded.h) cover EP with tp = 1, a
// capacity factor > 0 (padded blocks of a host-known size), with or without a shared expert,
// no CP and no recompute (docs/gpu.md, "MoE on CUDA"); the rest is refused by name.
template <class Refuse>
void refuse_on_device(const JobSpec& job, const std::string& layers, const std::string& backend,
                      const Refuse& refuse) {
  const ParallelSpec& p = job.parallel;
  const MoeSpec& moe = *job.model.moe;
  const std::string on = fmt::format("on the {} backend", backend);
  const std::string cpu = "use --backend cpu";
  if (moe.capacity_factor <= 0.0) {
    refuse(fmt::format("{} with dropless routing (moe.capacity_factor 0) {}", layers, on),
           "set a capacity factor > 0 (the device's all-to-all pads to capacity), or " + cpu);
  }
  if (p.tp > 1) {
    refuse(fmt::format("{} with tensor parallelism (tp = {}, expert tp = {}) {}", layers, p.tp,
                       p.expert_tp_size(), on),
           cpu);
  }
  if (p.cp > 1)
    refuse(fmt::format("{} with context parallelism (cp = {}) {}", layers, p.cp, on), cpu);
  if (p.recompute.granularity != RecomputeGranularity::kNone) {
    refuse(fmt::format("{} with activation recompute ({}) {}", layers,
                       recompute_granularity_name(p.recompute.granularity), on),
           cpu);
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
