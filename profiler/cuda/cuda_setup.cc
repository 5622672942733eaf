#include "profiler/cuda/cuda_setup.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "lib/error.h"
#include "runtime/cuda/device_comms.h"

namespace dhelix::cuda_profile {
namespace {

std::string plural(int64_t count, const char* noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

}  // namespace

void check_cuda_world_size(const JobSpec& job, int64_t world_size) {
  const ParallelSpec& p = job.parallel;
  const int64_t needed = p.world_size();
  if (world_size == needed) return;
  throw Error(ErrorCode::kInvalidInput,
              "the cuda backend profiles on every GPU of the job (tp " + std::to_string(p.tp) +
                  " x cp " + std::to_string(p.cp) + " x dp " + std::to_string(p.dp) + " x pp " +
                  std::to_string(p.pp) + " = " + plural(needed, "rank") + "): run mpirun -np " +
                  std::to_string(needed) + " dhelix-profile --backend cuda ... (this run has " +
                  plural(world_size, "rank") + ")");
}

std::string node_layout_problem(const std::vector<std::string>& hosts, int64_t gpus_per_node) {
  DHELIX_CHECK(gpus_per_node >= 1);
  const auto size = static_cast<int64_t>(hosts.size());
  for (int64_t rank = 0; rank < size; ++rank) {
    const int64_t first = rank / gpus_per_node * gpus_per_node;  // first rank of its node
    const auto r = static_cast<size_t>(rank), f = static_cast<size_t>(first);
    const bool same = hosts[r] == hosts[f];
    // A rank opening a new node must not share a host with the previous node.
    const bool fresh = rank != first || first == 0 || hosts[r] != hosts[f - 1];
    if (same && fresh) continue;
    const std::string layout = "the job puts " + plural(gpus_per_node, "rank") +
                               " on each node, in blocks (node = rank / " +
                               std::to_string(gpus_per_node) + ")";
    const std::string where =
        same ? "rank " + std::to_string(rank) + " is on host " + hosts[r] + " with rank " +
                   std::to_string(first - 1) + ", which belongs to the previous node"
             : "rank " + std::to_string(rank) + " is on host " + hosts[r] + " but rank " +
                   std::to_string(first) + " on host " + hosts[f];
    return layout + ", but " + where +
           ": start the ranks with mpirun --map-by ppr:" + std::to_string(gpus_per_node) +
           ":node or srun --ntasks-per-node=" + std::to_string(gpus_per_node) +
           " --distribution=block";
  }
  return "";
}

std::vector<ParallelDim> communication_dims(const ProfileSpace& space) {
  std::vector<ParallelDim> dims;
  for (const Op& op : space.ops) {
    if (!is_communication(op.kind) || op.group_size < 2) continue;
    if (std::find(dims.begin(), dims.end(), op.group) == dims.end()) dims.push_back(op.group);
  }
  return dims;
}

std::vector<NcclGroupSetup> nccl_group_setups(const Placement& placement,
                                              const std::vector<ParallelDim>& dims, int64_t rank) {
  std::vector<NcclGroupSetup> setups;
  for (ParallelDim dim : dims) {
    const ProcessGroup group = placement.group(dim, rank);
    const auto member = std::find(group.ranks.begin(), group.ranks.end(), rank);
    DHELIX_CHECK(member != group.ranks.end());
    setups.push_back({.dim = dim,
                      .root = group.ranks.front(),
                      .key = member - group.ranks.begin(),
                      .size = static_cast<int64_t>(group.ranks.size()),
                      .max_ctas = cuda::runtime_max_ctas(dim)});
  }
  return setups;
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  const int64_t hours = total / 3600, minutes = total / 60 % 60, secs = total % 60;
  char text[64];
  if (hours > 0) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", static_cast<long long>(hours),
                  static_cast<long long>(minutes), static_cast<long long>(secs));
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(minutes),
                  static_cast<long long>(secs));
  }
  return text;
}

std::string progress_line(int64_t done, int64_t total, double elapsed_s, int width) {
  DHELIX_CHECK(done >= 0 && done <= total && width >= 1);
  const int filled = total == 0 ? width : static_cast<int>(width * done / total);
  std::string line = "[" + std::string(static_cast<size_t>(filled), '#') +
                     std::string(static_cast<size_t>(width - filled), '.') + "] " +
                     std::to_string(done) + "/" + std::to_string(total) + ", ";
  if (done == 0) return line + "? left";
  const double left_s = elapsed_s / static_cast<double>(done) * static_cast<double>(total - done);
  return line + format_duration(left_s) + " left";
}

ProgressCallback timed_progress_bar(const std::string& label) {
  const auto start = std::chrono::steady_clock::now();
  const bool terminal = isatty(STDERR_FILENO) != 0;
  return [=, last_tenth = int64_t{-1}](int64_t done, int64_t total) mutable {
    const double elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t tenth = total == 0 ? 10 : 10 * done / total;
    if (!terminal && tenth == last_tenth) return;
    last_tenth = tenth;
    const std::string line = label + " " + progress_line(done, total, elapsed_s);
    std::fprintf(stderr, terminal ? "\r%s" : "%s\n", line.c_str());
    if (terminal && done == total) std::fputc('\n', stderr);
  };
}

std::vector<unsigned char> random_operand_bytes(DType dtype, int64_t elements, uint64_t seed) {
  DHELIX_CHECK(elements >= 0);
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> magnitude(1.0f / 32, 1.0f);
  const auto width = static_cast<size_t>(dtype_bytes(dtype));
  std::vector<unsigned char> bytes(static_cast<size_t>(elements) * width);
  for (size_t i = 0; i < static_cast<size_t>(elements); ++i) {
    const float value = (engine() & 1) != 0 ? -magnitude(engine) : magnitude(engine);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    uint32_t stored = bits;  // fp32: as is
    if (dtype == DType::kBf16) {
      stored = bits >> 16;  // truncation keeps the value finite and in range
    } else if (dtype == DType::kFp16) {
      // Re-bias the exponent (127 -> 15) and keep the top 10 mantissa bits; |value| in
      // [2^-5, 1) is a normal half.
      const uint32_t sign = (bits >> 31) << 15;
      const uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15;
      stored = sign | (exponent << 10) | ((bits >> 13) & 0x3ff);
    }
    for (size_t b = 0; b < width; ++b) bytes[i * width + b] = (stored >> (8 * b)) & 0xff;
  }
  return bytes;
}

}  // namespace dhelix::cuda_profile
