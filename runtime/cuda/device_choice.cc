#include "runtime/cuda/device_choice.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

#include "lib/error.h"

namespace dhelix::cuda {

LocalRank local_rank(const EnvironmentLookup& environment, int64_t world_rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const std::optional<std::string> value = environment(name);
    if (!value) continue;
    int64_t index = -1;
    const char* end = value->data() + value->size();
    const auto [stop, error] = std::from_chars(value->data(), end, index);
    if (error != std::errc() || stop != end || index < 0) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("{}='{}': not a rank index (a non-negative integer)", name, *value));
    }
    return LocalRank{index, name};
  }
  return LocalRank{world_rank, "world rank"};
}

int device_for_rank(const LocalRank& local, int64_t world_rank, int device_count) {
  if (device_count <= 0) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("rank {}: no CUDA device is visible (--backend cuda needs one GPU "
                            "per rank; check the driver and CUDA_VISIBLE_DEVICES)",
                            world_rank));
  }
  if (local.index >= device_count) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("rank {} is rank {} on its node ({}) but the node shows {} CUDA "
                            "device{}: run one rank per GPU",
                            world_rank, local.index, local.source, device_count,
                            device_count == 1 ? "" : "s"));
  }
  return static_cast<int>(local.index);
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace dhelix::cuda
