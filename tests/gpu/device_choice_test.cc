// Which GPU a rank takes (runtime/cuda/device_choice.h): host logic, no device needed.

#include "runtime/cuda/device_choice.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

template <class Body>
std::string error_text(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(DeviceChoice, LocalRankFromLaunchers) {
  std::map<std::string, std::string> env;
  const EnvLookup lookup = [&env](const char* name) -> const char* {
    const auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  };
  EXPECT_EQ(local_rank_from_environment(lookup), -1);
  env["MPI_LOCALRANKID"] = "5";
  EXPECT_EQ(local_rank_from_environment(lookup), 5);
  env["SLURM_LOCALID"] = "3";
  EXPECT_EQ(local_rank_from_environment(lookup), 3);
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "x1";  // not a number: skipped
  EXPECT_EQ(local_rank_from_environment(lookup), 3);
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "2";
  EXPECT_EQ(local_rank_from_environment(lookup), 2);
}

TEST(DeviceChoice, ChooseDevice) {
  EXPECT_EQ(choose_device(9, 1, 1, "3"), 0);  // one visible GPU: srun --gpus-per-task=1
  EXPECT_EQ(choose_device(5, 5, 8, nullptr), 5);
  EXPECT_EQ(error_text([] { choose_device(9, 9, 8, nullptr); }),
            "rank 9: local rank 9 but 8 GPUs are visible (CUDA_VISIBLE_DEVICES=<unset>): start "
            "one rank per GPU");
  EXPECT_EQ(error_text([] { choose_device(2, 2, 2, "0,1"); }),
            "rank 2: local rank 2 but 2 GPUs are visible (CUDA_VISIBLE_DEVICES=0,1): start one "
            "rank per GPU");
}

}  // namespace
}  // namespace dhelix::cuda
