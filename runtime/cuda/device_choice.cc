#include "runtime/cuda/device_choice.h"

#include <charconv>
#include <cstring>
#include <string>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

// A non-negative decimal integer, or -1.
int64_t parse_index(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  int64_t value = -1;
  const char* end = text + std::strlen(text);
  const auto [stop, error] = std::from_chars(text, end, value);
  if (error != std::errc() || stop != end || value < 0) return -1;
  return value;
}

std::string plural(int64_t count, const char* noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

}  // namespace

int64_t local_rank_from_environment(const EnvLookup& env) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const int64_t value = parse_index(env(name));
    if (value >= 0) return value;
  }
  return -1;
}

int choose_device(int64_t world_rank, int64_t local_rank, int device_count,
                  const char* cuda_visible_devices) {
  DHELIX_CHECK(device_count >= 1 && local_rank >= 0);
  if (device_count == 1) return 0;
  if (local_rank < device_count) return static_cast<int>(local_rank);
  throw Error(ErrorCode::kInvalidInput,
              "rank " + std::to_string(world_rank) + ": local rank " + std::to_string(local_rank) +
                  " but " + plural(device_count, "GPU") + (device_count == 1 ? " is" : " are") +
                  " visible (CUDA_VISIBLE_DEVICES=" +
                  (cuda_visible_devices == nullptr ? "<unset>" : cuda_visible_devices) +
                  "): start one rank per GPU");
}

}  // namespace dhelix::cuda
