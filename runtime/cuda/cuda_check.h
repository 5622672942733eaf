#pragma once
// One check wrapper per GPU library: every CUDA runtime, cuBLAS and NCCL call in dhelix goes
// through exactly one of these, so a failure always reads the same way: the call, the
// library's own error text, and where in the program it happened.
//
//   DHELIX_CUDA(cudaMalloc(&p, bytes));
//   DHELIX_CUBLAS(cublasGemmEx(...));
//   DHELIX_NCCL(ncclAllGather(...));
//
// A failure throws dhelix::Error(ErrorCode::kInternal) with
// "<call text> failed: <error name>: <error string> (<file>:<line>)". The caller adds the
// rank, op and plan position when it has them (runtime/exec/interpreter.cc does for every
// instruction). NCCL errors that leave a communicator unusable (an asynchronous error found
// by ncclCommGetAsyncError, a watchdog timeout) are the caller's to abort: see
// runtime/cuda/nccl_communicator.h.
//
// Only .cc/.cu files under runtime/cuda/ and profiler/cuda/ include this header.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace dhelix::cuda {

/// Throws Error(kInternal) unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
/// Throws Error(kInternal) unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
/// Throws Error(kInternal) unless result is ncclSuccess (or ncclInProgress for
/// non-blocking communicators, which the caller polls).
void check_nccl(ncclResult_t result, const char* call, const char* file, int line);

/// Name of a cuBLAS status ("CUBLAS_STATUS_NOT_SUPPORTED"); cuBLAS has no such function
/// before 11.4 and its text is terse, so dhelix keeps its own table.
const char* cublas_status_name(cublasStatus_t status);
/// Name of an NCCL result ("ncclSystemError"); NCCL only has the text (ncclGetErrorString).
const char* nccl_result_name(ncclResult_t result);

}  // namespace dhelix::cuda

#define DHELIX_CUDA(call) ::dhelix::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define DHELIX_CUBLAS(call) ::dhelix::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define DHELIX_NCCL(call) ::dhelix::cuda::check_nccl((call), #call, __FILE__, __LINE__)
