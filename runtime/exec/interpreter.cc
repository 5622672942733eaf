#include "runtime/exec/interpreter.h"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/exec/affinity.h"
#include "runtime/exec/bind.h"
#include "runtime/exec/instruction_errors.h"
#include "runtime/exec/jitter.h"
#include "runtime/exec/stream.h"
#include "runtime/exec/stream_lowering.h"

namespace dhelix::rt {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_us(Clock::time_point since) {
  return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
}

int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The CPU communicators' calls for run_collective (runtime/exec/bind.h).
struct CpuCollectives {
  Communicator& comm;
  void all_gather(const CollectiveRequest& r) { comm.all_gather(r.in_f32(), r.count, r.out_f32()); }
  void reduce_scatter_sum(const CollectiveRequest& r) {
    comm.reduce_scatter_sum(r.in_f32(), r.count, r.out_f32());
  }
  void all_reduce_sum(const CollectiveRequest& r) { comm.all_reduce_sum(r.out_f32(), r.count); }
  void ring_exchange(const CollectiveRequest& r) {
    comm.ring_exchange(r.in_f32(), r.out_f32(), r.count);
  }
  void all_to_all_v(const CollectiveRequest& r) {
    comm.all_to_all_v(r.in_f32(), r.send_counts, r.chunks, r.out_f32(), r.recv_counts, r.count);
  }
};

// Everything an execution holds: bound work, posted receives, started sends.
class Execution {
 public:
  Execution(const Plan& plan, const RankProgram& program, StageModel& model,
            CommunicatorDirectory& comms, ExecutionOptions options)
      : plan_(plan),
        program_(program),
        model_(model),
        comms_(comms),
        options_(std::move(options)) {}

  ExecutionStats run() {
    const size_t n = program_.instructions.size();
    bound_ = bind_program<Communicator>(
        plan_, program_, model_, [this](const Instruction& i) { return communicator_for(i); });
    work_.resize(n);
    transfers_.resize(n);
    if (options_.timings != nullptr) options_.timings->assign(n, OpTiming{});
    for (size_t i = 0; i < n; ++i) work_[i] = bind(program_.instructions[i]);
    post_receives();
    const Clock::time_point start = Clock::now();
    try {
      if (program_.mode == ExecutionMode::kSequential) {
        run_in_order();
      } else {
        run_on_streams();
      }
      for (auto& transfer : transfers_) {
        if (transfer) transfer->wait();
      }
    } catch (...) {
      // A transfer left open after a failure may never finish (its peer may be gone), and a
      // request waits when destroyed: leak them instead. The caller ends the process.
      for (auto& transfer : transfers_) static_cast<void>(transfer.release());
      throw;
    }
    stats_.wall_us = elapsed_us(start);
    stats_.instructions = static_cast<int64_t>(n);
    return stats_;
  }

 private:
  // The stream an instruction's communicators belong to: its own in co-executed mode,
  // the calling thread's in sequential mode.
  StreamClass comm_stream(const Instruction& instruction) const {
    return program_.mode == ExecutionMode::kSequential ? StreamClass::kCompute : instruction.stream;
  }

  Communicator* communicator_for(const Instruction& instruction) {
    if (instruction.kind == InstructionKind::kCollective) {
      if (!instruction.group) return nullptr;  // bind reports a collective without a group
      if (*instruction.group == ParallelDim::kCp) {
        // a2a+p2p's all-to-alls and ring run over CP sub-groups (the whole CP group
        // otherwise: CommunicatorDirectory::cp_level).
        const bool a2a = instruction.collective == OpKind::kAllToAll;
        const bool ring = instruction.collective == OpKind::kSendRecv;
        if (a2a || ring) {
          return &comms_.cp_level(a2a ? Placement::CpLevel::kA2a : Placement::CpLevel::kRing,
                                  comm_stream(instruction));
        }
      }
      return &comms_.group(*instruction.group, comm_stream(instruction));
    }
    return &comms_.point_to_point(comm_stream(instruction));
  }

  std::function<void()> bind(const Instruction& instruction) {
    const size_t index = static_cast<size_t>(&instruction - program_.instructions.data());
    std::function<void()> work = bind_work(instruction, index);
    double* busy = instruction.kind == InstructionKind::kRecv ? &stats_.receive_wait_us
                                                              : busy_counter(instruction.stream);
    const int64_t jitter_us = jitter_us_for(options_.jitter_seed, index, options_.jitter_us);
    OpTiming* timing = options_.timings != nullptr ? &(*options_.timings)[index] : nullptr;
    return [this, &instruction, work = std::move(work), busy, jitter_us, timing, index] {
      if (jitter_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter_us));
      if (options_.before_instruction) options_.before_instruction(index);
      const Clock::time_point start = Clock::now();
      run_naming_instruction(plan_, program_, instruction, work);
      const Clock::time_point end = Clock::now();
      *busy += std::chrono::duration<double, std::micro>(end - start).count();  // one thread
      if (timing != nullptr) {  // one instruction, one thread: no race
        timing->start_ns = to_ns(start);
        timing->end_ns = to_ns(end);
      }
      if (options_.on_instruction_done) options_.on_instruction_done(index);
    };
  }

  // The work of a bound instruction (bind_program did the binding and its checks).
  std::function<void()> bind_work(const Instruction& instruction, size_t index) {
    BoundInstruction<BoundOp, Communicator>& bound = bound_[index];
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        return [compute = std::move(bound.op.compute)] { compute(CpuBackend::Exec{}); };
      case InstructionKind::kCollective:
        return [request = *bound.op.collective, after = std::move(bound.op.after_collective),
                before = std::move(bound.op.before_collective), comm = bound.comm] {
          if (before) before(CpuBackend::Exec{});
          CpuCollectives collectives{*comm};
          run_collective(request, collectives);
          if (after) after(CpuBackend::Exec{});
        };
      case InstructionKind::kSend:
        return [this, index, data = static_cast<const float*>(bound.buffer),
                count = model_.boundary_elements(), comm = bound.comm, peer = instruction.peer,
                tag = instruction.tag] {
          // The send ends when its data has left the buffer, as a send on a CUDA stream
          // does: the buffer's memory may then hold another activation (the activation
          // arena, runtime/memory/buffer_spans.h). Receives are posted before any work, so
          // this waits for the transfer only, never for the receiver to reach its own.
          transfers_[index] = comm->start_send(data, count, peer, tag);
          transfers_[index]->wait();
        };
      case InstructionKind::kRecv:
        return [this, index] { transfers_[index]->wait(); };
    }
    return {};
  }

  double* busy_counter(StreamClass stream) {
    switch (stream) {
      case StreamClass::kLocalComm:
        return &stats_.local_comm_busy_us;
      case StreamClass::kCrossComm:
        return &stats_.cross_comm_busy_us;
      case StreamClass::kCompute:
        break;
    }
    return &stats_.compute_busy_us;
  }

  // Receives are posted before any work starts, on the thread that will wait for them,
  // so that no send ever waits for its receiver to reach the matching instruction.
  void post_receives() {
    for (size_t i = 0; i < program_.instructions.size(); ++i) {
      const Instruction& instruction = program_.instructions[i];
      if (instruction.kind != InstructionKind::kRecv) continue;
      transfers_[i] =
          bound_[i].comm->start_recv(static_cast<float*>(bound_[i].buffer),
                                     model_.boundary_elements(), instruction.peer, instruction.tag);
    }
  }

  void run_in_order() {
    const ScopedPin pin(options_.compute_cpu);
    try {
      for (size_t i = 0; i < work_.size(); ++i) {
        if (options_.timings != nullptr) (*options_.timings)[i].ready_ns = to_ns(Clock::now());
        work_[i]();
      }
    } catch (...) {
      if (options_.on_failure) options_.on_failure(std::current_exception());
      throw;
    }
  }

  // Each stream a thread, in the stream lowering's order (stream_lowering.h): an
  // instruction waits only for the events the GPU would wait for, and the rest holds by
  // stream order, so a co-executed CPU run checks the lowering as well as the plan.
  // Waiting for a receive blocks its thread, so receives get a stream of their own: a
  // communication stream stuck on a late message would hold back the collectives queued
  // behind it. Receives complete in program order, the order the plan's tasks need them.
  void run_on_streams() {
    auto failure = std::make_shared<FailureState>(options_.on_failure);
    std::array<std::unique_ptr<Stream>, kNumDeviceStreams> streams;
    for (int s = 0; s < kNumDeviceStreams; ++s) {
      const bool compute = static_cast<DeviceStream>(s) == DeviceStream::kCompute;
      streams[static_cast<size_t>(s)] =
          std::make_unique<Stream>(device_stream_name(static_cast<DeviceStream>(s)), failure,
                                   compute ? options_.compute_cpu : -1, !compute);
    }
    const StreamLowering lowering = lower_to_streams(program_);
    std::vector<size_t> recorded_by(static_cast<size_t>(lowering.num_events));
    for (const StreamOp& op : lowering.ops) {
      if (op.record_event >= 0) {
        recorded_by[static_cast<size_t>(op.record_event)] = static_cast<size_t>(op.instruction);
      }
    }
    std::vector<Completion> done(program_.instructions.size());
    for (const StreamOp& op : lowering.ops) {
      const auto i = static_cast<size_t>(op.instruction);
      std::vector<const Completion*> waits;
      for (int64_t event : op.wait_events) {
        waits.push_back(&done[recorded_by[static_cast<size_t>(event)]]);
      }
      int64_t* ready = options_.timings != nullptr ? &(*options_.timings)[i].ready_ns : nullptr;
      streams[static_cast<size_t>(op.stream)]->enqueue(std::move(work_[i]), std::move(waits),
                                                       &done[i], ready);
    }
    for (auto& stream : streams) stream->drain();
    failure->rethrow_if_failed();
  }

  const Plan& plan_;
  const RankProgram& program_;
  StageModel& model_;
  CommunicatorDirectory& comms_;
  ExecutionOptions options_;
  std::vector<BoundInstruction<BoundOp, Communicator>> bound_;
  std::vector<std::function<void()>> work_;
  std::vector<std::unique_ptr<TransferRequest>> transfers_;
  ExecutionStats stats_;
};

}  // namespace

ExecutionStats execute_program(const Plan& plan, const RankProgram& program, StageModel& model,
                               CommunicatorDirectory& comms, ExecutionOptions options) {
  return Execution(plan, program, model, comms, std::move(options)).run();
}

}  // namespace dhelix::rt
