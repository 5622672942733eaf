// The environment CUDA reads when it starts (runtime/cuda/cuda_environment.h) and the
// scan of the command line that decides to set it before MPI_Init (tools/cuda_start.h).
#include "runtime/cuda/cuda_environment.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/device_streams.h"
#include "tools/cuda_start.h"

namespace dhelix::cuda {
namespace {

// An environment of its own, so that the tests do not depend on the process's.
struct FakeEnvironment {
  std::map<std::string, std::string> values;
  std::vector<EnvironmentSetting> prepare(bool cuda_started) {
    return prepare_cuda_environment(
        [&](const char* name) -> const char* {
          const auto it = values.find(name);
          return it == values.end() ? nullptr : it->second.c_str();
        },
        [&](const char* name, const char* value) { values[name] = value; }, cuda_started);
  }
};

TEST(CudaEnvironment, SetOnlyWhereTheUserLeftItUnset) {
  FakeEnvironment env{{{"CUDA_DEVICE_MAX_CONNECTIONS", "16"}}};
  const auto settings = env.prepare(/*cuda_started=*/false);
  EXPECT_EQ(env.values.at("CUDA_MODULE_LOADING"), "LAZY");
  EXPECT_EQ(env.values.at("CUDA_DEVICE_MAX_CONNECTIONS"), "16");  // the user's, kept
  EXPECT_EQ(env.values.at("NCCL_RUNTIME_CONNECT"), "0");
  ASSERT_EQ(settings.size(), 3u);
  EXPECT_TRUE(settings[0].set_by_dhelix);
  EXPECT_FALSE(settings[1].set_by_dhelix);
  EXPECT_TRUE(settings[0].in_effect && settings[1].in_effect);
  EXPECT_EQ(value_in_effect(settings, "CUDA_MODULE_LOADING"), "LAZY");
  EXPECT_EQ(value_in_effect(settings, "CUDA_DEVICE_MAX_CONNECTIONS"), "16");
  EXPECT_TRUE(late_setting_notes(settings).empty());
}

TEST(CudaEnvironment, ASettingMadeAfterCudaStartedIsNotInEffect) {
  // As with a CUDA-aware MPI that made a context in MPI_Init before dhelix set anything:
  // the environment reads back dhelix's value, CUDA works with the process's start value.
  FakeEnvironment env;
  const auto settings = env.prepare(/*cuda_started=*/true);
  EXPECT_EQ(env.values.at("CUDA_DEVICE_MAX_CONNECTIONS"), "32");
  EXPECT_FALSE(settings[1].in_effect);
  EXPECT_EQ(value_in_effect(settings, "CUDA_DEVICE_MAX_CONNECTIONS"), std::nullopt);
  EXPECT_EQ(value_in_effect(settings, "CUDA_MODULE_LOADING"), std::nullopt);
  // NCCL reads its own when dhelix creates a communicator, after this: in effect.
  EXPECT_TRUE(settings[2].in_effect);
  EXPECT_EQ(value_in_effect(settings, "NCCL_RUNTIME_CONNECT"), "0");
  const std::vector<std::string> notes = late_setting_notes(settings);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[1].find("CUDA_DEVICE_MAX_CONNECTIONS=32"), std::string::npos) << notes[1];
  EXPECT_NE(notes[1].find("8 hardware queues"), std::string::npos) << notes[1];
  EXPECT_NE(notes[1].find("mpirun -x"), std::string::npos) << notes[1];
}

TEST(CudaEnvironment, AUsersNcclRuntimeConnectIsKept) {
  FakeEnvironment env{{{"NCCL_RUNTIME_CONNECT", "1"}}};
  const auto settings = env.prepare(false);
  EXPECT_EQ(env.values.at("NCCL_RUNTIME_CONNECT"), "1");
  EXPECT_FALSE(settings[2].set_by_dhelix);
}

TEST(CudaEnvironment, TheStreamCheckCountsAgainstTheValueInEffect) {
  // 15 streams: fine with dhelix's 32 in effect; refused when it was set too late and CUDA
  // kept its default of 8 (before, the check read dhelix's own 32 back and passed).
  const StreamCount count{.own = 5, .library = 10};
  FakeEnvironment in_time;
  EXPECT_NO_THROW(check_device_max_connections(
      value_in_effect(in_time.prepare(false), "CUDA_DEVICE_MAX_CONNECTIONS"), count));
  FakeEnvironment late;
  const auto settings = late.prepare(true);
  EXPECT_EQ(late.values.at("CUDA_DEVICE_MAX_CONNECTIONS"), "32");
  try {
    check_device_max_connections(value_in_effect(settings, "CUDA_DEVICE_MAX_CONNECTIONS"), count);
    ADD_FAILURE() << "15 streams accepted against CUDA's default of 8";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("CUDA started before dhelix-run could set it"),
              std::string::npos)
        << error.what();
  }
}

TEST(CudaEnvironment, TheProbeStartsNothing) {
  // Nothing in this process starts CUDA: without the driver library loaded the probe says
  // so, and with it loaded (a GPU machine) but not initialised it must still say so, and
  // not initialise it by asking (asking twice gives the same answer).
  EXPECT_FALSE(cuda_started_in_process());
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  EXPECT_FALSE(cuda_started_in_process());
  EXPECT_FALSE(cuda_started_in_process());
  if (driver != nullptr) dlclose(driver);
}

TEST(CudaStart, OnlyTheCudaBackendSetsTheEnvironmentBeforeMpi) {
  const auto asks = [](std::vector<const char*> args) {
    args.insert(args.begin(), "dhelix-run");
    return command_line_asks_for_cuda(static_cast<int>(args.size()), args.data());
  };
  EXPECT_TRUE(asks({"--plan", "p.json", "--backend", "cuda"}));
  EXPECT_TRUE(asks({"--backend=cuda", "--plan", "p.json"}));
  EXPECT_FALSE(asks({"--plan", "p.json"}));  // the default: cpu
  EXPECT_FALSE(asks({"--backend", "cpu"}));
  EXPECT_FALSE(asks({"--backend=cpu"}));
  EXPECT_TRUE(asks({"--backend", "cpu", "--backend", "cuda"}));  // the last one wins
  EXPECT_FALSE(asks({"--backend", "cuda", "--backend=cpu"}));
  EXPECT_FALSE(asks({"--backend"}));                     // a value missing: CLI11 refuses it
  EXPECT_FALSE(asks({"--", "--backend", "cuda"}));       // after --: not a flag
  EXPECT_FALSE(asks({"--backends=cuda"}));               // another flag
  EXPECT_FALSE(asks({"--data", "--backend=cuda.txt"}));  // not exactly cuda
}

}  // namespace
}  // namespace dhelix::cuda
