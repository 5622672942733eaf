// main() of the multi-rank test binary, run under mpirun: every rank runs the same tests
// (collectives need every member), rank 0 prints the usual report, the other ranks print
// only their failures, prefixed with their rank, and every rank exits with the same status
// (failed anywhere = failed everywhere), so mpirun's status is the job's.

#include <mpi.h>

#include <cstdio>
#include <exception>

#include <gtest/gtest.h>

#include "runtime/comm/mpi_environment.h"

namespace {

// Prints one rank's failed assertions; stands in for the default printer off rank 0.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int64_t rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %lld] %s:%d: Failure\n%s\n", static_cast<long long>(rank_),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %lld] FAILED %s.%s\n", static_cast<long long>(rank_),
                 info.test_suite_name(), info.name());
  }

 private:
  int64_t rank_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    dhelix::rt::MpiEnvironment mpi(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (mpi.world_rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(mpi.world_rank()));
    }
    const int failed_here = RUN_ALL_TESTS() != 0 ? 1 : 0;
    int failed_anywhere = failed_here;
    dhelix::rt::check_mpi(
        MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
        "MPI_Allreduce");
    if (failed_anywhere && !failed_here) {
      std::fprintf(stderr, "[rank %lld] passed here, but another rank failed\n",
                   static_cast<long long>(mpi.world_rank()));
    }
    return failed_anywhere;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dhelix_mpi_tests: error: %s\n", error.what());
    return 1;
  }
}
