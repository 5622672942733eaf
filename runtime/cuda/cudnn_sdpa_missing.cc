// CudnnSdpa without cuDNN: on a node whose libcudnn cannot be loaded (cudnn_sdpa.cc) and,
// in a build without cuDNN's headers (DHELIX_WITH_CUDNN off), as the only implementation.
#include <utility>

#include "lib/error.h"
#include "runtime/cuda/cudnn_sdpa.h"

namespace dhelix::cuda {
namespace {

class MissingCudnn final : public CudnnSdpa {
 public:
  explicit MissingCudnn(std::string why) : why_(std::move(why)) {}
  int64_t version() const override { return 0; }
  std::optional<std::string> prepare(const kernels::AttentionShape&, bool) override { return why_; }
  bool has_plans(const kernels::AttentionShape&) const override { return false; }
  int64_t workspace_bytes(const kernels::AttentionShape&) const override { return 0; }
  void forward(const kernels::AttentionShape&, const __nv_bfloat16*, const __nv_bfloat16*,
               const __nv_bfloat16*, __nv_bfloat16*, float*, const Workspace&,
               cudaStream_t) override {
    refuse();
  }
  void backward(const kernels::AttentionShape&, const __nv_bfloat16*, const __nv_bfloat16*,
                const __nv_bfloat16*, const __nv_bfloat16*, const float*, const __nv_bfloat16*,
                __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*, const Workspace&,
                cudaStream_t) override {
    refuse();
  }

 private:
  [[noreturn]] void refuse() const {
    throw Error(ErrorCode::kInternal, "cuDNN attention called without cuDNN: " + why_);
  }
  std::string why_;
};

}  // namespace

std::unique_ptr<CudnnSdpa> missing_cudnn(std::string why) {
  return std::make_unique<MissingCudnn>(std::move(why));
}

#ifndef DHELIX_WITH_CUDNN
bool CudnnSdpa::built_with_cudnn() { return false; }
std::optional<std::string> check_graph_descriptors(const SdpaGraph&, bool* loaded) {
  *loaded = false;
  return "this dhelix was built without cuDNN";
}
std::unique_ptr<CudnnSdpa> CudnnSdpa::load() {
  return missing_cudnn("this dhelix was built without cuDNN (DHELIX_WITH_CUDNN off)");
}
#endif

}  // namespace dhelix::cuda
