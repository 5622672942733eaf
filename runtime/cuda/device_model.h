#pragma once
// The model as the CUDA executor (device_executor.h) sees it: ops that run on a device
// stream handle. StageModelOnDevice adapts a BasicStageModel<B> whose B::Exec is made from
// a stream handle: CudaBackend for the GPU (cuda_engine.cc), the tests' RecordingBackend
// for the fake device (tests/gpu/recording_device.h). Host code only.

#include <functional>
#include <optional>
#include <utility>

#include "runtime/cuda/device_api.h"
#include "runtime/model/element_type.h"
#include "runtime/model/stage_model.h"

namespace dhelix::cuda {

/// An op bound for the device: closures over a stream handle.
struct DeviceBoundOp {
  using Task = std::function<void(StreamHandle)>;
  Task compute;                                     ///< compute ops
  std::optional<rt::CollectiveRequest> collective;  ///< communication ops
  Task after_collective;                            ///< optional local step after it
  Task before_collective;                           ///< optional local step before it
};

/// What the executor needs of a model (StageModel's own contracts).
class DeviceModel {
 public:
  using BoundOp = DeviceBoundOp;
  virtual ~DeviceModel() = default;
  /// StageModel::bind: allocates the op's buffers.
  virtual BoundOp bind(const rt::OpRef& ref) = 0;
  /// The residual-stream buffers pipeline transfers move (boundary_elements() each).
  virtual void* residual(int64_t micro_batch, int64_t layer) = 0;
  virtual void* residual_grad(int64_t micro_batch, int64_t layer) = 0;
  virtual int64_t boundary_elements() const = 0;
  virtual rt::ElementType activation_type() const = 0;
};

/// A BasicStageModel<B> as a DeviceModel; exec_for(stream) makes the B::Exec an op runs
/// with on that stream. The model must outlive the adapter.
template <class B>
class StageModelOnDevice final : public DeviceModel {
 public:
  using ExecFor = std::function<typename B::Exec(StreamHandle)>;
  StageModelOnDevice(rt::BasicStageModel<B>& model, ExecFor exec_for)
      : model_(model), exec_for_(std::move(exec_for)) {}

  BoundOp bind(const rt::OpRef& ref) override {
    typename rt::BasicStageModel<B>::BoundOp op = model_.bind(ref);
    BoundOp bound;
    bound.collective = op.collective;
    if (op.compute) bound.compute = wrap(std::move(op.compute));
    if (op.after_collective) bound.after_collective = wrap(std::move(op.after_collective));
    if (op.before_collective) bound.before_collective = wrap(std::move(op.before_collective));
    return bound;
  }
  void* residual(int64_t micro_batch, int64_t layer) override {
    return model_.residual(micro_batch, layer);
  }
  void* residual_grad(int64_t micro_batch, int64_t layer) override {
    return model_.residual_grad(micro_batch, layer);
  }
  int64_t boundary_elements() const override { return model_.boundary_elements(); }
  rt::ElementType activation_type() const override { return model_.activation_type(); }

 private:
  template <class Task>
  DeviceBoundOp::Task wrap(Task task) {
    return [task = std::move(task), this](StreamHandle stream) { task(exec_for_(stream)); };
  }

  rt::BasicStageModel<B>& model_;
  ExecFor exec_for_;
};

}  // namespace dhelix::cuda
