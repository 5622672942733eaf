// Which GPU a rank takes (runtime/cuda/device_choice.h): host logic, no device needed.

#include "runtime/cuda/device_choice.h"

#include <gtest/gtest.h>

#include <map>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

EnvironmentLookup environment(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

TEST(DeviceChoice, OpenMpiComesFirstThenSlurmThenHydra) {
  const LocalRank open_mpi =
      local_rank(environment({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "1"}}), 11);
  EXPECT_EQ(open_mpi.index, 3);
  EXPECT_EQ(open_mpi.source, "OMPI_COMM_WORLD_LOCAL_RANK");
  const LocalRank slurm =
      local_rank(environment({{"SLURM_LOCALID", "1"}, {"MPI_LOCALRANKID", "2"}}), 11);
  EXPECT_EQ(slurm.index, 1);
  EXPECT_EQ(local_rank(environment({{"MPI_LOCALRANKID", "2"}}), 11).index, 2);
}

TEST(DeviceChoice, WithoutALauncherTheWorldRankIsTheLocalRank) {
  const LocalRank local = local_rank(environment({}), 6);
  EXPECT_EQ(local.index, 6);
  EXPECT_EQ(local.source, "world rank");
}

TEST(DeviceChoice, AGarbledVariableIsNamed) {
  try {
    local_rank(environment({{"SLURM_LOCALID", "1x"}}), 0);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "SLURM_LOCALID='1x': not a rank index (a non-negative integer)");
  }
  EXPECT_THROW(local_rank(environment({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}), 0), Error);
}

TEST(DeviceChoice, OneRankPerDevice) {
  EXPECT_EQ(device_for_rank(LocalRank{2, "SLURM_LOCALID"}, 10, 4), 2);
  try {
    device_for_rank(LocalRank{5, "OMPI_COMM_WORLD_LOCAL_RANK"}, 5, 4);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(std::string(error.what()),
              "rank 5 is rank 5 on its node (OMPI_COMM_WORLD_LOCAL_RANK) but the node shows 4 "
              "CUDA devices: run one rank per GPU");
  }
  try {
    device_for_rank(LocalRank{0, "world rank"}, 1, 0);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "rank 1: no CUDA device is visible (--backend cuda needs one GPU per rank; check "
              "the driver and CUDA_VISIBLE_DEVICES)");
  }
}

}  // namespace
}  // namespace dhelix::cuda
