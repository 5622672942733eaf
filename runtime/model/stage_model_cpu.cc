// The CPU backend's model: BasicStageModel instantiated for CpuBackend.

#include "runtime/model/stage_model_impl.h"

namespace dhelix::rt {

static_assert(ModelBackend<CpuBackend>);
template class BasicStageModel<CpuBackend>;

}  // namespace dhelix::rt
