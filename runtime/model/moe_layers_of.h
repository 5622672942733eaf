#pragma once
// Which class binds a backend's MoE layers, for BasicStageModel<B> (stage_model_impl.h):
// MoeLayersOf<B> is specialised next to each implementation (runtime/model/moe_layers_cpu.h,
// runtime/cuda/moe_layers_cuda.h) with
//   type   the class (static handles(op), bind, sum_input_gradient, parameters,
//          aux_loss_sum, dropped_copies);
//   Io     the dense layer's buffers it connects to (x, y, dy, dx);
//   make   its construction from the job, the rank's layers and the model's memory.
// A backend without one keeps this primary template, and its stage model refuses MoE
// models (check_supported).

namespace dhelix::rt {

/// The type of a backend without MoE layers.
struct NoMoeLayers {};

template <class B>
struct MoeLayersOf {
  using type = NoMoeLayers;
};

}  // namespace dhelix::rt
