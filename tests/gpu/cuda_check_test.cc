// The check wrappers need no device: error names and texts are tables in the libraries.
#include "runtime/cuda/cuda_check.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

std::string message_of(void (*check)()) {
  try {
    check();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
    return error.what();
  }
  return "(no error)";
}

TEST(CudaCheck, SuccessDoesNotThrow) {
  EXPECT_NO_THROW(check_cuda(cudaSuccess, "cudaFree(p)", "a.cc", 1));
  EXPECT_NO_THROW(check_cublas(CUBLAS_STATUS_SUCCESS, "cublasCreate(&h)", "a.cc", 2));
  EXPECT_NO_THROW(check_nccl(ncclSuccess, "ncclGroupEnd()", "a.cc", 3));
  // Non-blocking communicators answer ncclInProgress; the caller polls.
  EXPECT_NO_THROW(check_nccl(ncclInProgress, "ncclCommInitRankConfig(...)", "a.cc", 4));
}

TEST(CudaCheck, CudaFailureNamesCallErrorAndPlace) {
  EXPECT_EQ(message_of([] {
              check_cuda(cudaErrorMemoryAllocation, "cudaMalloc(&p, bytes)", "pool.cc", 42);
            }),
            "cudaMalloc(&p, bytes) failed: cudaErrorMemoryAllocation: out of memory (pool.cc:42)");
  EXPECT_EQ(message_of([] { check_cuda(cudaErrorInvalidValue, "cudaMemcpy(...)", "x.cc", 7); }),
            "cudaMemcpy(...) failed: cudaErrorInvalidValue: invalid argument (x.cc:7)");
}

TEST(CudaCheck, MacroQuotesTheCallAndThisFile) {
  const std::string message = message_of([] { DHELIX_CUDA(cudaErrorInvalidDevice); });
  EXPECT_EQ(message.rfind("cudaErrorInvalidDevice failed: cudaErrorInvalidDevice: invalid device "
                          "ordinal (",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("cuda_check_test.cc:"), std::string::npos) << message;
}

TEST(CudaCheck, CublasFailureUsesOurNameTable) {
  const std::string message = message_of(
      [] { check_cublas(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx(...)", "gemm.cc", 9); });
  EXPECT_EQ(message, std::string("cublasGemmEx(...) failed: CUBLAS_STATUS_NOT_SUPPORTED: ") +
                         cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED) + " (gemm.cc:9)");
  EXPECT_STREQ(cublas_status_name(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_STREQ(cublas_status_name(CUBLAS_STATUS_EXECUTION_FAILED),
               "CUBLAS_STATUS_EXECUTION_FAILED");
  EXPECT_STREQ(cublas_status_name(static_cast<cublasStatus_t>(999)), "CUBLAS_STATUS_UNKNOWN");
}

TEST(CudaCheck, NcclFailureNamesResult) {
  const std::string message =
      message_of([] { check_nccl(ncclRemoteError, "ncclAllGather(...)", "comm.cc", 5); });
  EXPECT_EQ(message, std::string("ncclAllGather(...) failed: ncclRemoteError: ") +
                         ncclGetErrorString(ncclRemoteError) + " (comm.cc:5)");
  EXPECT_STREQ(nccl_result_name(ncclSystemError), "ncclSystemError");
  EXPECT_STREQ(nccl_result_name(ncclInvalidUsage), "ncclInvalidUsage");
  EXPECT_STREQ(nccl_result_name(static_cast<ncclResult_t>(99)), "ncclUnknownResult");
}

}  // namespace
}  // namespace dhelix::cuda
