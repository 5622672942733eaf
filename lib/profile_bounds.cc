#include "lib/profile_bounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "lib/error.h"

namespace dhelix {
namespace {

// Half the resolution of the times a profile file keeps (quantize_profile_value): a time at
// the bound may be written this much below it.
constexpr double kRoundingUs = 0.5e-4;
constexpr size_t kMaxProblemsListed = 8;
// The finest resolution of any clock a profile is measured with (CUDA events: 0.5 us;
// std::chrono::steady_clock on Linux: 1 ns): a time of an op that does work below it is no
// measurement. The floor for ops without a FLOP or bandwidth bound (elementwise ops, norms).
constexpr double kTimerResolutionUs = 1e-3;

double peak_flops_per_us(const GpuSpec& gpu) { return gpu.peak_bf16_tflops * 1e6; }

// Bytes per microsecond over every link a rank of `op`'s group could use at once.
double link_bytes_per_us(const ClusterSpec& cluster, const Op& op) {
  double gbps = cluster.intra_node.bandwidth_gbps;
  if (op.scope == GroupScope::kCrossNode) {
    gbps += static_cast<double>(cluster.nics_per_node) * cluster.inter_node.bandwidth_gbps;
  }
  return gbps * 1e3;
}

std::string link_figures(const ClusterSpec& cluster, const Op& op) {
  if (op.scope != GroupScope::kCrossNode) {
    return fmt::format("{:.6g} GB/s (cluster intra_node.bandwidth_gbps)",
                       cluster.intra_node.bandwidth_gbps);
  }
  return fmt::format(
      "{:.6g} GB/s (cluster intra_node.bandwidth_gbps {:.6g} + nics_per_node {} x "
      "inter_node.bandwidth_gbps {:.6g})",
      link_bytes_per_us(cluster, op) / 1e3, cluster.intra_node.bandwidth_gbps,
      cluster.nics_per_node, cluster.inter_node.bandwidth_gbps);
}

// Ops whose FLOPs are their kernel's work: matrix products on the tensor cores. The FLOPs
// of an elementwise op, a norm or a loss are a count, not a bound: such kernels are limited by
// memory, may be fused into a neighbour, or skipped where there is nothing to do (the CPU
// runtime's bias-dropout-add backward without dropout, traced at 0.02-0.04 us against the
// 0.02 us its 8192 FLOPs would need at the cpu-host peak).
bool is_matrix_work(OpKind kind) {
  return kind == OpKind::kGemm || kind == OpKind::kGroupedGemm || kind == OpKind::kHead ||
         kind == OpKind::kRouter || kind == OpKind::kAttention;
}

struct Bound {
  const Op* op = nullptr;  // one op of the signature with the least bound
  double min_us = 0;
};

// The work a zero time would skip, for messages ("" when the op does none).
std::string work_text(const ClusterSpec& cluster, const Op& op) {
  if (minimum_op_time_us(cluster, op) > 0) return minimum_op_time_reason(cluster, op);
  if (op.flops > 0) return fmt::format("it does {:.6g} FLOPs", op.flops);
  const int64_t bytes = op.bytes_read + op.bytes_written;
  if (bytes > 0) return fmt::format("it moves {} bytes of device memory", bytes);
  return "";
}

// One problem: a time below its op's bound.
std::string problem_text(const std::string& file, const std::string& pointer, double time_us,
                         const ClusterSpec& cluster, const Bound& bound) {
  const std::string value = fmt::format("{:.6g} us", time_us);
  if (time_us == 0) {
    return fmt::format("{}: {}: {} for op {}: no op that does work takes zero time: {}", file,
                       pointer, value, bound.op->signature(), work_text(cluster, *bound.op));
  }
  if (time_us < kTimerResolutionUs && bound.min_us < kTimerResolutionUs) {
    return fmt::format(
        "{}: {}: {} for op {} is below the 1 ns resolution of any timer: no "
        "measurement gives it ({})",
        file, pointer, value, bound.op->signature(), work_text(cluster, *bound.op));
  }
  return fmt::format("{}: {}: {} is faster than the hardware allows for op {}: {}", file, pointer,
                     value, bound.op->signature(), minimum_op_time_reason(cluster, *bound.op));
}

}  // namespace

double minimum_work_flops(const Op& op) {
  if (op.kind != OpKind::kAttention || !op.shape.causal) return op.flops;
  // Op::flops counts every (query, key) pair (Megatron's convention); a causal kernel
  // computes the pairs under the mask, and within a window only the window's.
  const OpShape& s = op.shape;
  const auto q = static_cast<double>(s.q_len);
  const auto kv = static_cast<double>(s.kv_len);
  double pairs = q * kv / 2;
  if (s.window > 0 && s.window < s.kv_len) {
    const auto w = static_cast<double>(s.window);
    pairs = std::min(pairs, w <= q ? q * w - w * w / 2 : q * w);
  }
  const double forward = 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) * pairs *
                         static_cast<double>(s.head_dim);
  // The backward's matrix products are twice the forward's, as Op::flops counts them.
  return std::min(op.flops, op.pass == Pass::kBackward ? 2.0 * forward : forward);
}

double minimum_link_bytes(const Op& op) {
  if (op.group_size <= 1) return 0;
  const auto bytes = static_cast<double>(op.comm_bytes);
  const auto n = static_cast<double>(op.group_size);
  switch (op.kind) {
    case OpKind::kSendRecv:
      return bytes;
    case OpKind::kReduceScatter:
      return bytes / n;
    default:
      return bytes * (n - 1) / n;
  }
}

double minimum_op_time_us(const ClusterSpec& cluster, const Op& op) {
  if (is_communication(op.kind)) {
    const double rate = link_bytes_per_us(cluster, op);
    return rate > 0 ? minimum_link_bytes(op) / rate : 0;
  }
  if (!is_matrix_work(op.kind)) return 0;
  const double rate = peak_flops_per_us(cluster.gpu);
  return rate > 0 ? minimum_work_flops(op) / rate : 0;
}

std::string minimum_op_time_reason(const ClusterSpec& cluster, const Op& op) {
  const double least_us = minimum_op_time_us(cluster, op);
  if (is_communication(op.kind)) {
    return fmt::format(
        "the {:.6g} bytes that must reach each of its {} ranks need at least {:.6g} "
        "us at {}",
        minimum_link_bytes(op), op.group_size, least_us, link_figures(cluster, op));
  }
  return fmt::format(
      "its {:.6g} FLOPs need at least {:.6g} us at the GPU's peak of {:.6g} TFLOP/s "
      "(cluster gpu.peak_bf16_tflops)",
      minimum_work_flops(op), least_us, cluster.gpu.peak_bf16_tflops);
}

void check_profile_bounds(const Profile& profile, const std::vector<Op>& ops,
                          const ClusterSpec& cluster, const std::string& profile_file) {
  // The least bound per signature (ops of one signature have one shape, so one bound; the
  // least keeps the check on the safe side should they not).
  std::unordered_map<std::string, Bound> bounds;
  for (const Op& op : ops) {
    const double least = minimum_op_time_us(cluster, op);
    auto [it, inserted] = bounds.try_emplace(op.signature(), Bound{&op, least});
    if (!inserted && least < it->second.min_us) it->second = Bound{&op, least};
  }
  std::vector<std::string> problems;
  // A time breaks its bound when it is below a timer's resolution (zero included) for an op
  // with work, or below the bound by more than the file's rounding.
  const auto check = [&](const std::string& pointer, double time_us, const Bound& bound) {
    const bool has_work = !work_text(cluster, *bound.op).empty();
    if ((has_work && time_us < kTimerResolutionUs) || time_us < bound.min_us - kRoundingUs) {
      problems.push_back(problem_text(profile_file, pointer, time_us, cluster, bound));
    }
  };
  for (size_t i = 0; i < profile.ops().size(); ++i) {
    const ProfiledOp& op = profile.ops()[i];
    const auto it = bounds.find(op.signature);
    if (it == bounds.end()) continue;  // an op the job does not use: never read
    // The median, the time the planner prices the op at; the fastest sample alone may sit
    // below the bound by a timer's resolution (a 64 x 64 elementwise op traced at 0.02 us
    // on a CPU rank), which says nothing about the hardware.
    check(fmt::format("/ops/{}/time_us/median", i), op.time_us.median_us, it->second);
  }
  for (size_t i = 0; i < profile.pairs().size(); ++i) {
    const ProfiledPair& pair = profile.pairs()[i];
    const auto a = bounds.find(pair.a);
    const auto b = bounds.find(pair.b);
    if (a != bounds.end())
      check(fmt::format("/pairs/{}/finish_a_us", i), pair.finish_a_us, a->second);
    if (b != bounds.end())
      check(fmt::format("/pairs/{}/finish_b_us", i), pair.finish_b_us, b->second);
  }
  if (problems.empty()) return;
  std::string message = fmt::format(
      "{}: {} time{} faster than the job's cluster {} (GPU {}) can run {}: the profile was "
      "not measured on that hardware; profile the job there (dhelix-profile JOB):",
      profile_file, problems.size(), problems.size() == 1 ? " is" : "s are", cluster.name,
      cluster.gpu.name, problems.size() == 1 ? "its op" : "their ops");
  for (size_t i = 0; i < std::min(problems.size(), kMaxProblemsListed); ++i) {
    message += "\n" + problems[i];
  }
  if (problems.size() > kMaxProblemsListed) {
    message += fmt::format("\n... and {} more", problems.size() - kMaxProblemsListed);
  }
  throw Error(ErrorCode::kInvalidInput, message);
}

}  // namespace dhelix
