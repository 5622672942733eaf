#include "lib/parallel_spec.h"

#include "lib/error.h"

namespace dhelix {

const char* parallel_dim_name(ParallelDim dim) {
  switch (dim) {
    case ParallelDim::kTp:
      return "tp";
    case ParallelDim::kCp:
      return "cp";
    case ParallelDim::kEp:
      return "ep";
    case ParallelDim::kDp:
      return "dp";
    case ParallelDim::kPp:
      return "pp";
  }
  DHELIX_CHECK_MSG(false, "unknown ParallelDim");
  return "";
}

std::string rank_order_text(const std::vector<ParallelDim>& order) {
  std::string text;
  for (ParallelDim dim : order) {
    if (!text.empty()) text += "-";
    text += parallel_dim_name(dim);
  }
  return text;
}

}  // namespace dhelix
