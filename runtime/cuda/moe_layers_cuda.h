#pragma once
// The MoE MLP of every layer of a CUDA stage model, bound to the plan's ops as
// runtime/model/moe_layers_cpu.h binds them on the CPU (read that file first: the same op
// chain, weights, initial values, gradient groups and aux-loss weight), with the kernels of
// moe_cuda.h and every buffer between permute and unpermute padded to the capacity
// (runtime/kernels/moe_padded.h). What differs from the CPU:
//
//   * shapes are fixed on the host: E C rows in the rank's permuted layout, and the same
//     E C = ep L C rows arrive from the EP group (L C from each member), so every buffer is
//     allocated once per (micro-batch, layer) and the expert GEMMs run on ep C rows per
//     local expert; zero padding rows stay zero and add nothing to the weight gradients;
//   * the all-to-alls are DeviceCommunicator::all_to_all_v's padded blocks (count = E C h,
//     out's capacity; blocks of L C h), with the per-expert counts the router writes on
//     the device travelling beside them (nothing reads them back on the host);
//   * the dispatch's local step regroups source-major -> expert-major on the stream
//     (moe_regroup), grouped_fc2 and grouped_fc1_dgrad regroup back before the exchange.
//
// Scope (runtime/train/moe_support.cc refuses the rest by name): EP with tp = 1, a
// capacity factor > 0, no shared expert, no recompute. CudaStageModel binds it through
// runtime/model/moe_layers_of.h.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "runtime/cuda/cuda_model_backend.h"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/model/moe_layers_of.h"
#include "runtime/model/stage_model.h"

namespace dhelix::cuda {

/// The buffers of the dense layer the MoE MLP connects to, for one (micro-batch, layer).
struct MoeDeviceLayerIo {
  const bf16* x = nullptr;   ///< the MLP's input [T, h] (ln_mlp's output)
  bf16* y = nullptr;         ///< the MLP's output [T, h]
  const bf16* dy = nullptr;  ///< d y [T, h]
  bf16* dx = nullptr;        ///< d x [T, h] (what ln_mlp's backward reads)
};

class MoeLayersCuda {
 public:
  using BoundOp = rt::BasicBoundOp<CudaBackend>;
  using ParameterView = rt::BasicParameterView<CudaBackend>;

  /// The MoE MLPs of `layers` on world rank `rank` of `job`, buffers from `memory` (which
  /// must outlive this). `loss_scale` is read when the router's backward is enqueued.
  /// Throws Error(kUnsupported) outside the scope above (check_moe_shape's limits too).
  MoeLayersCuda(const JobSpec& job, int64_t rank, const std::vector<int64_t>& layers, uint64_t seed,
                const float* loss_scale, CudaBackend::Memory& memory);
  ~MoeLayersCuda();
  MoeLayersCuda(const MoeLayersCuda&) = delete;
  MoeLayersCuda& operator=(const MoeLayersCuda&) = delete;

  /// True for the op ids this class binds (fwd.swiglu and bwd.swiglu included).
  static bool handles(const std::string& op);
  /// Binds `op` of (micro_batch, layer); nullopt when `op` is not one of handles(). An
  /// all-to-all op with ep = 1 is Error(kInvalidInput) (the planner writes none).
  /// `recomputing` must be false (no recompute here; the stage model's interface has it).
  std::optional<BoundOp> bind(const std::string& op, int64_t layer, int64_t micro_batch,
                              const MoeDeviceLayerIo& io, bool recomputing = false);
  /// The step bwd.ln_mlp runs first: io.dx = permute's + the router's input gradients.
  BoundOp::Task sum_input_gradient(int64_t layer, int64_t micro_batch, const MoeDeviceLayerIo& io,
                                   bool recomputing = false);
  /// `layer`'s "layers.<l>.router", ".experts_fc1", ".experts_fc2" (the last two expert).
  std::vector<ParameterView> parameters(int64_t layer);
  /// Sum of the load-balancing losses of micro-batches [0, micro_batches) over this rank's
  /// layers; downloads, so call it between iterations only.
  float aux_loss_sum(int64_t micro_batches);
  /// Token copies dropped over capacity in the last forward; downloads, as above.
  int64_t dropped_copies();
  /// C: rows per expert block.
  int64_t capacity() const { return shape_.capacity; }

 private:
  struct Weights;
  struct State;
  State& state(int64_t micro_batch, int64_t layer);

  MoeDeviceShape shape_;
  int64_t ffn_ = 0;      // F: one expert's FFN width
  int64_t ep_ = 1;       // EP group size
  int64_t ep_rank_ = 0;  // this rank's index in it
  int64_t local_ = 0;    // L = E / ep
  const float* loss_scale_;
  CudaBackend::Memory& memory_;
  std::map<int64_t, std::unique_ptr<Weights>> weights_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<State>> states_;  // (mb, layer)
};

}  // namespace dhelix::cuda

namespace dhelix::rt {

/// The CUDA backend's MoE layers (runtime/model/moe_layers_of.h).
template <>
struct MoeLayersOf<cuda::CudaBackend> {
  using type = cuda::MoeLayersCuda;
  using Io = cuda::MoeDeviceLayerIo;
  static std::unique_ptr<cuda::MoeLayersCuda> make(const JobSpec& job, int64_t rank,
                                                   const std::vector<int64_t>& layers,
                                                   uint64_t seed, const float* loss_scale,
                                                   cuda::CudaBackend::Memory& memory) {
    return std::make_unique<cuda::MoeLayersCuda>(job, rank, layers, seed, loss_scale, memory);
  }
};

}  // namespace dhelix::rt
