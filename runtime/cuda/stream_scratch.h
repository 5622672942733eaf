#pragma once
// Zeroed device scratch for the set-up's warm-ups and the attention self-check, written on
// the stream that will use it. The rank's streams are non-blocking (DeviceApi::create_stream),
// so nothing orders them after the legacy default stream: a buffer zeroed with a plain
// cudaMemset (legacy stream) may still be being written while a kernel on one of them reads
// it (issue #31, point 8). So the zeroing is DeviceApi::zero_async on the user's stream, and
// the legacy stream (a null handle) is refused.

#include <cstdint>

#include "lib/error.h"
#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

class StreamScratch {
 public:
  /// max(bytes, 1) bytes from DeviceApi::allocate_scratch, zeroed on `stream`. Throws
  /// Error(kInternal) for the legacy stream (nullptr).
  StreamScratch(DeviceApi& api, int64_t bytes, StreamHandle stream)
      : api_(api), bytes_(bytes < 1 ? 1 : bytes) {
    if (stream == nullptr) {
      throw Error(ErrorCode::kInternal,
                  "scratch zeroed on the legacy default stream: the rank's streams are "
                  "non-blocking and would not wait for it");
    }
    data_ = api_.allocate_scratch(bytes_);
    try {
      api_.zero_async(data_, bytes_, stream);
    } catch (...) {
      api_.free_scratch(data_);
      throw;
    }
  }
  /// The caller has waited for `stream`'s use of the buffer (the set-up does, before it
  /// returns).
  ~StreamScratch() { api_.free_scratch(data_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  DeviceApi& api_;
  int64_t bytes_;
  void* data_ = nullptr;
};

}  // namespace dhelix::cuda
