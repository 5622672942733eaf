#include "runtime/cuda/device_executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/device_schedule.h"
#include "runtime/cuda/enqueue_watchdog.h"
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
      enqueue_watched();
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
    stream_of_instruction_.assign(program_.instructions.size(), nullptr);
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
              // a2a+p2p: the all-to-alls and the ring over their CP sub-groups, as the
              // CPU interpreter's communicator_for.
              if (*instruction.group == ParallelDim::kCp && comms_.has_cp_levels() &&
                  (instruction.collective == OpKind::kAllToAll ||
                   instruction.collective == OpKind::kSendRecv)) {
                return &comms_.cp_level(instruction.collective == OpKind::kAllToAll
                                            ? Placement::CpLevel::kA2a
                                            : Placement::CpLevel::kRing,
                                        stream_of_op[index]);
              }
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

  // Every communicator the bound program uses, each once.
  std::vector<DeviceCommunicator*> used_comms() const {
    std::set<DeviceCommunicator*> used;
    for (const Bound& bound : bound_) {
      if (bound.comm != nullptr) used.insert(bound.comm);
    }
    return {used.begin(), used.end()};
  }

  // What the host is enqueueing now, for the enqueue watchdog's report.
  std::string position() const {
    const int64_t index = enqueueing_.load();
    if (index < 0) return "the iteration's start or its joins (no instruction)";
    return describe_instruction(plan_, program_, program_.instructions[static_cast<size_t>(index)]);
  }

  // enqueue_all under the enqueue watchdog (enqueue_watchdog.h): its failure, when it found
  // one, is the cause of whatever the enqueueing thread then failed with.
  void enqueue_watched() {
    EnqueueWatchdog watchdog(used_comms(), options_.timeout_s, options_.poll_period_s,
                             [this] { return position(); });
    try {
      enqueue_all([&] { watchdog.check(); });
    } catch (...) {
      watchdog.stop();
      if (std::exception_ptr cause = watchdog.failure()) throw_while_enqueueing(cause);
      throw;
    }
    watchdog.stop();
    if (std::exception_ptr cause = watchdog.failure()) throw_while_enqueueing(cause);
  }

  [[noreturn]] void throw_while_enqueueing(const std::exception_ptr& cause) const {
    try {
      std::rethrow_exception(cause);
    } catch (const Error& error) {
      throw Error(error.code(), fmt::format("rank {}: while enqueueing the iteration: {}",
                                            program_.rank, error.what()));
    }
  }

  void enqueue_all(const std::function<void()>& check) {
    start();
    for (const PostedReceive& receive : schedule_.receives) post(receive);
    for (const StreamOp& op : schedule_.lowering.ops) {
      check();
      enqueue(op);
    }
    check();
    StreamHandle compute = streams_.stream(DeviceStream::kCompute);
    for (size_t i = 0; i < schedule_.join_streams.size(); ++i) {
      record(schedule_.join_events[i], streams_.stream(schedule_.join_streams[i]));
      wait(compute, streams_.event(schedule_.join_events[i]));
    }
    api_.record_event(streams_.end_event(), compute);
  }

  void post(const PostedReceive& receive) {
    const auto index = static_cast<size_t>(receive.instruction);
    enqueueing_.store(receive.instruction);
    at_instruction(program_.instructions[index], [&] {
      StreamHandle stream = streams_.channel_stream(receive.peer);
      last_on_stream_[stream] = index;
      stream_of_instruction_[index] = stream;
      // The sender is member 0 of the channel, the receiver member 1 (device_comms.h).
      bound_[index].comm->recv(bound_[index].buffer, count_, dtype_, 0, stream);
      record(receive.event, stream);
      recorded_on_stream_[stream].emplace_back(index, receive.event);
    });
    enqueueing_.store(-1);
  }

  void enqueue(const StreamOp& op) {
    const auto index = static_cast<size_t>(op.instruction);
    const Instruction& instruction = program_.instructions[index];
    enqueueing_.store(op.instruction);
    at_instruction(instruction, [&] {
      StreamHandle stream = streams_.stream(op.stream);
      last_on_stream_[stream] = index;
      stream_of_instruction_[index] = stream;
      for (int64_t event : op.wait_events) wait(stream, streams_.event(event));
      if (options_.before_instruction) options_.before_instruction(index, stream);
      api_.delay(
          rt::jitter_us_for(options_.jitter_seed, static_cast<uint64_t>(index), options_.jitter_us),
          stream);
      run(instruction, bound_[index], stream, schedule_.receive_event[index]);
      if (op.record_event >= 0) {
        record(op.record_event, stream);
        recorded_on_stream_[stream].emplace_back(index, op.record_event);
      }
      if (options_.after_instruction) options_.after_instruction(index, stream);
    });
    enqueueing_.store(-1);
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
    const std::vector<DeviceCommunicator*> used = used_comms();
    const Clock::time_point since = Clock::now();
    StreamHandle compute = streams_.stream(DeviceStream::kCompute);
    while (!api_.stream_done(compute)) {
      for (DeviceCommunicator* comm : used) comm->poll();
      if (std::chrono::duration<double>(Clock::now() - since).count() > options_.timeout_s) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("rank {}: the iteration did not finish within {} s "
                                "(--watchdog-s); streams still busy: {}",
                                program_.rank, options_.timeout_s, busy_streams()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (DeviceCommunicator* comm : used) comm->poll();
  }

  // Where a busy stream is: between the last of its instructions whose event has fired and
  // the first whose event has not (only instructions another stream waits on record one).
  std::string position_on(StreamHandle stream) const {
    const auto recorded = recorded_on_stream_.find(stream);
    if (recorded == recorded_on_stream_.end()) return "";
    const std::pair<size_t, int64_t>* finished = nullptr;
    for (const auto& entry : recorded->second) {
      if (!api_.event_done(streams_.event(entry.second))) {
        std::string at =
            fmt::format("on or before: {}; ",
                        describe_instruction(plan_, program_, program_.instructions[entry.first]));
        if (finished == nullptr) return at;
        return at + fmt::format("after: {}; ",
                                describe_instruction(plan_, program_,
                                                     program_.instructions[finished->first]));
      }
      finished = &entry;
    }
    return "";  // past its last recorded instruction: on one of those enqueued after it
  }

  // Every busy stream, with where it is (position_on) and what it was last given: the
  // instruction it is on is that one or an earlier one of the same stream; and the
  // communicators it used, with their last operation (a peer that never joined that
  // operation is the usual cause).
  std::string busy_streams() const {
    std::vector<std::string> busy;
    const auto describe = [&](std::string name, StreamHandle stream) {
      if (api_.stream_done(stream)) return;
      const auto last = last_on_stream_.find(stream);
      if (last == last_on_stream_.end()) {
        busy.push_back(fmt::format("{} (no instruction of this iteration)", name));
        return;
      }
      std::vector<std::string> comms;
      for (size_t i = 0; i < bound_.size(); ++i) {
        const DeviceCommunicator* comm = bound_[i].comm;
        if (comm == nullptr || stream_of_instruction_[i] != stream) continue;
        const std::string entry =
            fmt::format("NCCL {} (last op {})", comm->name(), comm->last_op());
        if (std::find(comms.begin(), comms.end(), entry) == comms.end()) comms.push_back(entry);
      }
      busy.push_back(
          fmt::format("{} ({}last instruction enqueued: {}{}{})", name, position_on(stream),
                      describe_instruction(plan_, program_, program_.instructions[last->second]),
                      comms.empty() ? "" : "; ", fmt::join(comms, ", ")));
    };
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      const auto stream = static_cast<DeviceStream>(s);
      describe(device_stream_name(stream), streams_.stream(stream));
    }
    for (int64_t peer : streams_.receive_peers()) {
      describe(fmt::format("receive from rank {}", peer), streams_.channel_stream(peer));
    }
    return busy.empty() ? "none" : fmt::format("{}", fmt::join(busy, "; "));
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
  std::vector<StreamHandle> stream_of_instruction_;  // where each instruction was enqueued
  // The last instruction enqueued on each stream, and those that recorded an event with
  // their events in enqueue order, for the watchdog's report.
  std::map<StreamHandle, size_t> last_on_stream_;
  std::map<StreamHandle, std::vector<std::pair<size_t, int64_t>>> recorded_on_stream_;
  // The instruction being enqueued (-1: none), read by the enqueue watchdog's thread.
  std::atomic<int64_t> enqueueing_{-1};
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
