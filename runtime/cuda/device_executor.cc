#include "runtime/cuda/device_executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_schedule.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/exec/instruction_errors.h"
#include "runtime/exec/jitter.h"

namespace dhelix::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using Exec = rt::CudaBackend::Exec;

struct BoundInstruction {
  CudaStageModel::BoundOp op;          // compute and collective ops
  DeviceCommunicator* comm = nullptr;  // collectives and transfers
  void* buffer = nullptr;              // transfers
};

void run_collective(const rt::CollectiveRequest& request, DeviceCommunicator& comm,
                    cudaStream_t stream) {
  const DeviceDtype dtype = device_dtype_of(request.element);
  switch (request.kind) {
    case rt::CollectiveKind::kAllGather:
      comm.all_gather(request.in, request.count, dtype, request.out, stream);
      return;
    case rt::CollectiveKind::kReduceScatter:
      comm.reduce_scatter_sum(request.in, request.count, dtype, request.out, stream);
      return;
    case rt::CollectiveKind::kAllReduce:
      comm.all_reduce_sum(request.out, request.count, dtype, stream);
      return;
  }
}

rt::OpRef ref_of(const Instruction& instruction) {
  return {.op = std::string(instruction.op),
          .layer = instruction.layer,
          .micro_batch = instruction.micro_batch};
}

class DeviceExecution {
 public:
  DeviceExecution(const Plan& plan, const RankProgram& program, CudaStageModel& model,
                  DeviceCommDirectory& comms, DeviceStreams& streams,
                  DeviceExecutionOptions options)
      : plan_(plan),
        program_(program),
        model_(model),
        comms_(comms),
        streams_(streams),
        options_(std::move(options)),
        schedule_(schedule_device_program(program, comms.receive_orders(program.mode))),
        count_(model.boundary_elements()),
        dtype_(device_dtype_of(model.activation_type())) {}

  DeviceExecutionStats run() {
    streams_.reserve_events(schedule_.num_events);
    bind_all();
    // Binding allocates and zeroes buffers on the device pool's stream, which the model
    // does not wait for; the device is otherwise idle between iterations, so waiting for
    // all of it is cheap and keeps the first op from seeing a buffer before it is ready.
    DHELIX_CUDA(cudaDeviceSynchronize());
    if (options_.after_binding) options_.after_binding();
    try {
      enqueue_all();
      wait_for_end();
    } catch (...) {
      if (options_.on_failure) options_.on_failure(std::current_exception());
      throw;
    }
    float elapsed_ms = 0;
    DHELIX_CUDA(cudaEventElapsedTime(&elapsed_ms, streams_.start_event(), streams_.end_event()));
    return {.wall_us = 1000.0 * static_cast<double>(elapsed_ms),
            .instructions = static_cast<int64_t>(program_.instructions.size()),
            .events = schedule_.num_events,
            .waits = waits_};
  }

 private:
  template <class Work>
  void at_instruction(const Instruction& instruction, Work&& work) const {
    rt::run_naming_instruction(plan_, program_, instruction, std::forward<Work>(work));
  }

  void* transfer_buffer(const Instruction& instruction) {
    return instruction.gradient ? model_.residual_grad(instruction.micro_batch, instruction.layer)
                                : model_.residual(instruction.micro_batch, instruction.layer);
  }

  void bind_all() {
    bound_.resize(program_.instructions.size());
    for (const StreamOp& op : schedule_.lowering.ops) {
      const Instruction& instruction = program_.instructions[static_cast<size_t>(op.instruction)];
      at_instruction(instruction, [&] {
        bound_[static_cast<size_t>(op.instruction)] = bind(instruction, op.stream);
      });
    }
  }

  BoundInstruction bind(const Instruction& instruction, DeviceStream stream) {
    BoundInstruction bound;
    const char* kind = instruction_kind_name(instruction.kind);
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        bound.op = model_.bind(ref_of(instruction));
        if (!bound.op.compute) throw_unbound("no computation", kind);
        break;
      case InstructionKind::kCollective:
        bound.op = model_.bind(ref_of(instruction));
        if (!bound.op.collective) throw_unbound("no collective", kind);
        if (!instruction.group) throw_unbound("a collective without a group", kind);
        bound.comm = &comms_.group(*instruction.group, stream);
        break;
      case InstructionKind::kSend:
        bound.comm = &comms_.channel_to(instruction.peer);
        bound.buffer = transfer_buffer(instruction);
        break;
      case InstructionKind::kRecv:
        bound.comm = &comms_.channel_from(instruction.peer);
        bound.buffer = transfer_buffer(instruction);
        check_channel_stream(instruction.peer);
        break;
    }
    return bound;
  }

  [[noreturn]] static void throw_unbound(const char* what, const char* kind) {
    throw Error(ErrorCode::kInternal, fmt::format("the model bound {} for a {} op", what, kind));
  }

  void check_channel_stream(int64_t peer) const {
    for (int64_t p : streams_.receive_peers()) {
      if (p == peer) return;
    }
    throw Error(ErrorCode::kInternal,
                fmt::format("the device streams have no channel stream for rank {}", peer));
  }

  Exec exec_on(DeviceStream stream) const {
    return {.stream = streams_.stream(stream),
            .gemm = stream == DeviceStream::kCompute ? &streams_.compute_gemm() : nullptr};
  }

  void record(int64_t event, cudaStream_t stream) {
    DHELIX_CUDA(cudaEventRecord(streams_.event(event), stream));
  }
  void wait(cudaStream_t stream, cudaEvent_t event) {
    DHELIX_CUDA(cudaStreamWaitEvent(stream, event, 0));
    ++waits_;
  }

  // Every stream after the start event, so that the wall time covers all their work.
  void start() {
    cudaStream_t compute = streams_.stream(DeviceStream::kCompute);
    DHELIX_CUDA(cudaEventRecord(streams_.start_event(), compute));
    for (int s = 1; s < kNumDeviceStreams; ++s) {
      wait(streams_.stream(static_cast<DeviceStream>(s)), streams_.start_event());
    }
    for (int64_t peer : streams_.receive_peers()) {
      wait(streams_.channel_stream(peer), streams_.start_event());
    }
  }

  void enqueue_all() {
    start();
    for (const PostedReceive& receive : schedule_.receives) post(receive);
    for (const StreamOp& op : schedule_.lowering.ops) enqueue(op);
    cudaStream_t compute = streams_.stream(DeviceStream::kCompute);
    for (size_t i = 0; i < schedule_.join_streams.size(); ++i) {
      record(schedule_.join_events[i], streams_.stream(schedule_.join_streams[i]));
      wait(compute, streams_.event(schedule_.join_events[i]));
    }
    DHELIX_CUDA(cudaEventRecord(streams_.end_event(), compute));
  }

  void post(const PostedReceive& receive) {
    const auto index = static_cast<size_t>(receive.instruction);
    at_instruction(program_.instructions[index], [&] {
      cudaStream_t stream = streams_.channel_stream(receive.peer);
      // The sender is member 0 of the channel, the receiver member 1 (device_comms.h).
      bound_[index].comm->recv(bound_[index].buffer, count_, dtype_, 0, stream);
      record(receive.event, stream);
    });
  }

  void enqueue(const StreamOp& op) {
    const auto index = static_cast<size_t>(op.instruction);
    const Instruction& instruction = program_.instructions[index];
    at_instruction(instruction, [&] {
      cudaStream_t stream = streams_.stream(op.stream);
      for (int64_t event : op.wait_events) wait(stream, streams_.event(event));
      delay(
          rt::jitter_us_for(options_.jitter_seed, static_cast<uint64_t>(index), options_.jitter_us),
          stream);
      run(instruction, bound_[index], op.stream, schedule_.receive_event[index]);
      if (op.record_event >= 0) record(op.record_event, stream);
    });
  }

  void run(const Instruction& instruction, BoundInstruction& bound, DeviceStream on,
           int64_t receive_event) {
    cudaStream_t stream = streams_.stream(on);
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        bound.op.compute(exec_on(on));
        return;
      case InstructionKind::kCollective:
        run_collective(*bound.op.collective, *bound.comm, stream);
        if (bound.op.after_collective) bound.op.after_collective(exec_on(on));
        return;
      case InstructionKind::kSend:
        bound.comm->send(bound.buffer, count_, dtype_, 1, stream);
        return;
      case InstructionKind::kRecv:
        wait(stream, streams_.event(receive_event));
        return;
    }
  }

  // Waits for the compute stream, into which every stream was joined, polling every
  // communicator: an NCCL failure on any of them ends the wait with its error.
  void wait_for_end() {
    std::set<DeviceCommunicator*> used;
    for (const BoundInstruction& bound : bound_) {
      if (bound.comm != nullptr) used.insert(bound.comm);
    }
    const Clock::time_point since = Clock::now();
    cudaStream_t compute = streams_.stream(DeviceStream::kCompute);
    for (;;) {
      const cudaError_t status = cudaStreamQuery(compute);
      if (status == cudaSuccess) break;
      if (status != cudaErrorNotReady) DHELIX_CUDA(status);
      for (DeviceCommunicator* comm : used) comm->poll();
      if (std::chrono::duration<double>(Clock::now() - since).count() > options_.timeout_s) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("rank {}: the iteration did not finish within {} s; streams "
                                "still busy: {}",
                                program_.rank, options_.timeout_s, busy_streams()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (DeviceCommunicator* comm : used) comm->poll();
  }

  std::string busy_streams() const {
    std::vector<std::string> busy;
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      const auto stream = static_cast<DeviceStream>(s);
      if (cudaStreamQuery(streams_.stream(stream)) == cudaErrorNotReady) {
        busy.emplace_back(device_stream_name(stream));
      }
    }
    for (int64_t peer : streams_.receive_peers()) {
      if (cudaStreamQuery(streams_.channel_stream(peer)) == cudaErrorNotReady) {
        busy.push_back(fmt::format("receive from rank {}", peer));
      }
    }
    return busy.empty() ? "none" : fmt::format("{}", fmt::join(busy, ", "));
  }

  const Plan& plan_;
  const RankProgram& program_;
  CudaStageModel& model_;
  DeviceCommDirectory& comms_;
  DeviceStreams& streams_;
  DeviceExecutionOptions options_;
  DeviceSchedule schedule_;
  int64_t count_;
  DeviceDtype dtype_;
  std::vector<BoundInstruction> bound_;
  int64_t waits_ = 0;
};

}  // namespace

DeviceExecutionStats execute_device_program(const Plan& plan, const RankProgram& program,
                                            CudaStageModel& model, DeviceCommDirectory& comms,
                                            DeviceStreams& streams,
                                            DeviceExecutionOptions options) {
  return DeviceExecution(plan, program, model, comms, streams, std::move(options)).run();
}

}  // namespace dhelix::cuda
