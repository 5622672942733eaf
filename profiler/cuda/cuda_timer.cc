#include "profiler/cuda/cuda_timer.h"

#include <algorithm>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda_profile {
namespace {

// Events made for one call and destroyed with it, also when an op throws.
class EventSet {
 public:
  explicit EventSet(size_t count) : events_(count, nullptr) {
    for (cudaEvent_t& event : events_) DHELIX_CUDA(cudaEventCreate(&event));
  }
  ~EventSet() {
    for (cudaEvent_t event : events_) {
      if (event != nullptr) (void)cudaEventDestroy(event);  // nothing to do on failure here
    }
  }
  EventSet(const EventSet&) = delete;
  EventSet& operator=(const EventSet&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

double elapsed_us(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  DHELIX_CUDA(cudaEventElapsedTime(&ms, from, to));
  return static_cast<double>(ms) * 1000.0;
}

}  // namespace

CudaTimer::CudaTimer(int64_t l2_bytes) : flush_bytes_(std::max<int64_t>(2 * l2_bytes, 1 << 20)) {
  int least = 0, greatest = 0;  // CUDA: numerically lower is higher priority
  DHELIX_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  DHELIX_CUDA(cudaStreamCreateWithFlags(&start_, cudaStreamNonBlocking));
  DHELIX_CUDA(cudaStreamCreateWithPriority(&compute_, cudaStreamNonBlocking, least));
  for (cudaStream_t& comm : comm_) {
    DHELIX_CUDA(cudaStreamCreateWithPriority(&comm, cudaStreamNonBlocking, greatest));
  }
  DHELIX_CUDA(cudaMalloc(&flush_, static_cast<size_t>(flush_bytes_)));
}

CudaTimer::~CudaTimer() {
  // Destructors must not throw: failures while tearing down are ignored.
  (void)cudaDeviceSynchronize();
  (void)cudaFree(flush_);
  for (cudaStream_t stream : {start_, compute_, comm_[0], comm_[1]}) {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
}

cudaStream_t CudaTimer::stream(StreamRole role) const {
  switch (role) {
    case StreamRole::kCompute:
      return compute_;
    case StreamRole::kComm0:
      return comm_[0];
    case StreamRole::kComm1:
      return comm_[1];
  }
  return compute_;
}

std::vector<std::vector<double>> CudaTimer::time_runs(const std::vector<const Enqueue*>& ops,
                                                      const std::vector<StreamRole>& roles,
                                                      int64_t runs,
                                                      const std::function<void()>& before_each) {
  DHELIX_CHECK(runs >= 0 && !ops.empty() && ops.size() == roles.size());
  const size_t n = static_cast<size_t>(runs), width = ops.size();
  // Per run: the start event, then each op's begin and end events.
  const size_t stride = 1 + 2 * width;
  const EventSet events(n * stride);
  const auto start = [&](size_t run) { return events[run * stride]; };
  const auto begin = [&](size_t run, size_t op) { return events[run * stride + 1 + 2 * op]; };
  const auto end = [&](size_t run, size_t op) { return events[run * stride + 2 + 2 * op]; };
  for (size_t run = 0; run < n; ++run) {
    if (before_each) {
      DHELIX_CUDA(cudaDeviceSynchronize());
      before_each();
    }
    for (size_t op = 0; run > 0 && op < width; ++op) {
      DHELIX_CUDA(cudaStreamWaitEvent(start_, end(run - 1, op), 0));
    }
    DHELIX_CUDA(cudaMemsetAsync(flush_, static_cast<int>(run & 0xff),
                                static_cast<size_t>(flush_bytes_), start_));
    DHELIX_CUDA(cudaEventRecord(start(run), start_));
    for (size_t op = 0; op < width; ++op) {
      const cudaStream_t s = stream(roles[op]);
      DHELIX_CUDA(cudaStreamWaitEvent(s, start(run), 0));
      DHELIX_CUDA(cudaEventRecord(begin(run, op), s));
      (*ops[op])(s);
      DHELIX_CUDA(cudaEventRecord(end(run, op), s));
    }
  }
  DHELIX_CUDA(cudaDeviceSynchronize());
  std::vector<std::vector<double>> times(width);
  for (size_t run = 0; run < n; ++run) {
    for (size_t op = 0; op < width; ++op) {
      max_start_lag_us_ = std::max(max_start_lag_us_, elapsed_us(start(run), begin(run, op)));
      times[op].push_back(elapsed_us(start(run), end(run, op)));
    }
  }
  return times;
}

std::vector<double> CudaTimer::time_solo(const Enqueue& op, StreamRole role, int64_t runs,
                                         const std::function<void()>& before_each) {
  return time_runs({&op}, {role}, runs, before_each).front();
}

std::vector<CoRunSample> CudaTimer::time_pair(const Enqueue& a, StreamRole role_a, const Enqueue& b,
                                              StreamRole role_b, int64_t runs,
                                              const std::function<void()>& before_each) {
  DHELIX_CHECK(role_a != role_b);
  const std::vector<std::vector<double>> times =
      time_runs({&a, &b}, {role_a, role_b}, runs, before_each);
  std::vector<CoRunSample> samples;
  for (size_t run = 0; run < times[0].size(); ++run) {
    samples.push_back({.finish_a_us = times[0][run], .finish_b_us = times[1][run]});
  }
  return samples;
}

}  // namespace dhelix::cuda_profile
