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
#include "runtime/cuda/device_schedule.h"
#include "runtime/exec/bind.h"
#include "runtime/exec/instruction_errors.h"
#include "runtime/exec/jitter.h"

namespace dhelix::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using Bound = rt::BoundInstruction<DeviceBoundOp, DeviceCommunicator>;

// The device communicators' calls for rt::run_collective.
struct DeviceCollectives {
  DeviceCommunicator& comm;
  void all_gather(const rt::CollectiveRequest& r, StreamHandle stream) {
    comm.all_gather(r.in, r.count, device_dtype_of(r.element), r.out, stream);
  }
  void reduce_scatter_sum(const rt::CollectiveRequest& r, StreamHandle stream) {
    comm.reduce_scatter_sum(r.in, r.count, device_dtype_of(r.element), r.out, stream);
  }
  void all_reduce_sum(const rt::CollectiveRequest& r, StreamHandle stream) {
    comm.all_reduce_sum(r.out, r.count, device_dtype_of(r.element), stream);
  }
  void ring_exchange(const rt::CollectiveRequest& r, StreamHandle stream) {
    comm.ring_exchange(r.in, r.out, r.count, device_dtype_of(r.element), stream);
  }
  // The device's all-to-all is padded to capacity (nccl_communicator.h): r.count is out's
  // capacity, size() blocks of r.count / size() elements, and the counts are device memory.
  // The MoE layer's dispatch and combine (runtime/model/moe_layers_padded.h): blocks of
  // L C h elements, L counts per member.
  void all_to_all_v(const rt::CollectiveRequest& r, StreamHandle stream) {
    if (r.count % comm.size() != 0) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("all_to_all_v on the device: the capacity {} is not {} equal blocks",
                              r.count, comm.size()));
    }
    comm.all_to_all_v(r.in, r.send_counts, r.chunks, r.out, r.recv_counts, r.count / comm.size(),
                      device_dtype_of(r.element), stream);
  }
};

class DeviceExecution {
 public:
  DeviceExecution(DeviceApi& api, const Plan& plan, const RankProgram& program, DeviceModel& model,
                  DeviceCommDirectory& comms, DeviceStreams& streams,
                  DeviceExecutionOptions options)
      : api_(api),
        plan_(plan),
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
    if (options_.synchronize_after_binding) api_.synchronize_device();
    if (options_.after_binding) options_.after_binding();
    try {
      enqueue_all();
      wait_for_end();
    } catch (...) {
      if (options_.on_failure) options_.on_failure(std::current_exception());
      throw;
    }
    const double elapsed_ms = api_.elapsed_ms(streams_.start_event(), streams_.end_event());
    return {.wall_us = 1000.0 * elapsed_ms,
            .instructions = static_cast<int64_t>(program_.instructions.size()),
            .events = schedule_.num_events,
            .waits = waits_};
  }

 private:
  template <class Work>
  void at_instruction(const Instruction& instruction, Work&& work) const {
    rt::run_naming_instruction(plan_, program_, instruction, std::forward<Work>(work));
  }

  void bind_all() {
    std::vector<DeviceStream> stream_of_op(program_.instructions.size());
    for (const StreamOp& op : schedule_.lowering.ops) {
      stream_of_op[static_cast<size_t>(op.instruction)] = op.stream;
    }
    bound_ = rt::bind_program<DeviceCommunicator>(
        plan_, program_, model_, [&](const Instruction& instruction) -> DeviceCommunicator* {
          const auto index = static_cast<size_t>(&instruction - program_.instructions.data());
          switch (instruction.kind) {
            case InstructionKind::kCollective:
              if (!instruction.group) return nullptr;
              return &comms_.group(*instruction.group, stream_of_op[index]);
            case InstructionKind::kSend:
              return &comms_.channel_to(instruction.peer);
            case InstructionKind::kRecv:
              check_channel_stream(instruction.peer);
              return &comms_.channel_from(instruction.peer);
            case InstructionKind::kCompute:
              break;
          }
          return nullptr;
        });
  }

  void check_channel_stream(int64_t peer) const {
    for (int64_t p : streams_.receive_peers()) {
      if (p == peer) return;
    }
    throw Error(ErrorCode::kInternal,
                fmt::format("the device streams have no channel stream for rank {}", peer));
  }

  void record(int64_t event, StreamHandle stream) {
    api_.record_event(streams_.event(event), stream);
  }
  void wait(StreamHandle stream, EventHandle event) {
    api_.wait_event(stream, event);
    ++waits_;
  }

  // Every stream after the start event, so that the wall time covers all their work.
  void start() {
    StreamHandle compute = streams_.stream(DeviceStream::kCompute);
    api_.record_event(streams_.start_event(), compute);
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
    StreamHandle compute = streams_.stream(DeviceStream::kCompute);
    for (size_t i = 0; i < schedule_.join_streams.size(); ++i) {
      record(schedule_.join_events[i], streams_.stream(schedule_.join_streams[i]));
      wait(compute, streams_.event(schedule_.join_events[i]));
    }
    api_.record_event(streams_.end_event(), compute);
  }

  void post(const PostedReceive& receive) {
    const auto index = static_cast<size_t>(receive.instruction);
    at_instruction(program_.instructions[index], [&] {
      StreamHandle stream = streams_.channel_stream(receive.peer);
      // The sender is member 0 of the channel, the receiver member 1 (device_comms.h).
      bound_[index].comm->recv(bound_[index].buffer, count_, dtype_, 0, stream);
      record(receive.event, stream);
    });
  }

  void enqueue(const StreamOp& op) {
    const auto index = static_cast<size_t>(op.instruction);
    const Instruction& instruction = program_.instructions[index];
    at_instruction(instruction, [&] {
      StreamHandle stream = streams_.stream(op.stream);
      for (int64_t event : op.wait_events) wait(stream, streams_.event(event));
      if (options_.before_instruction) options_.before_instruction(index, stream);
      api_.delay(
          rt::jitter_us_for(options_.jitter_seed, static_cast<uint64_t>(index), options_.jitter_us),
          stream);
      run(instruction, bound_[index], stream, schedule_.receive_event[index]);
      if (op.record_event >= 0) record(op.record_event, stream);
      if (options_.after_instruction) options_.after_instruction(index, stream);
    });
  }

  void run(const Instruction& instruction, Bound& bound, StreamHandle stream,
           int64_t receive_event) {
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        bound.op.compute(stream);
        return;
      case InstructionKind::kCollective: {
        DeviceCollectives collectives{*bound.comm};
        if (bound.op.before_collective) bound.op.before_collective(stream);
        rt::run_collective(*bound.op.collective, collectives, stream);
        if (bound.op.after_collective) bound.op.after_collective(stream);
        return;
      }
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
    for (const Bound& bound : bound_) {
      if (bound.comm != nullptr) used.insert(bound.comm);
    }
    const Clock::time_point since = Clock::now();
    StreamHandle compute = streams_.stream(DeviceStream::kCompute);
    while (!api_.stream_done(compute)) {
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
      if (!api_.stream_done(streams_.stream(stream))) {
        busy.emplace_back(device_stream_name(stream));
      }
    }
    for (int64_t peer : streams_.receive_peers()) {
      if (!api_.stream_done(streams_.channel_stream(peer))) {
        busy.push_back(fmt::format("receive from rank {}", peer));
      }
    }
    return busy.empty() ? "none" : fmt::format("{}", fmt::join(busy, ", "));
  }

  DeviceApi& api_;
  const Plan& plan_;
  const RankProgram& program_;
  DeviceModel& model_;
  DeviceCommDirectory& comms_;
  DeviceStreams& streams_;
  DeviceExecutionOptions options_;
  DeviceSchedule schedule_;
  int64_t count_;
  DeviceDtype dtype_;
  std::vector<Bound> bound_;
  int64_t waits_ = 0;
};

}  // namespace

DeviceExecutionStats execute_device_program(DeviceApi& api, const Plan& plan,
                                            const RankProgram& program, DeviceModel& model,
                                            DeviceCommDirectory& comms, DeviceStreams& streams,
                                            DeviceExecutionOptions options) {
  return DeviceExecution(api, plan, program, model, comms, streams, std::move(options)).run();
}

}  // namespace dhelix::cuda
