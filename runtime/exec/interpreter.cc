#include "runtime/exec/interpreter.h"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/exec/instruction_errors.h"
#include "runtime/exec/jitter.h"
#include "runtime/exec/stream.h"

namespace dhelix::rt {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_us(Clock::time_point since) {
  return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
}

void run_collective(const CollectiveRequest& request, Communicator& comm) {
  switch (request.kind) {
    case CollectiveKind::kAllGather:
      comm.all_gather(request.in_f32(), request.count, request.out_f32());
      return;
    case CollectiveKind::kReduceScatter:
      comm.reduce_scatter_sum(request.in_f32(), request.count, request.out_f32());
      return;
    case CollectiveKind::kAllReduce:
      comm.all_reduce_sum(request.out_f32(), request.count);
      return;
  }
}

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
    work_.resize(n);
    transfers_.resize(n);
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

  float* transfer_buffer(const Instruction& instruction) {
    return instruction.gradient ? model_.residual_grad(instruction.micro_batch, instruction.layer)
                                : model_.residual(instruction.micro_batch, instruction.layer);
  }

  std::function<void()> bind(const Instruction& instruction) {
    const size_t index = static_cast<size_t>(&instruction - program_.instructions.data());
    std::function<void()> work = bind_work(instruction, index);
    double* busy = instruction.kind == InstructionKind::kRecv ? &stats_.receive_wait_us
                                                              : busy_counter(instruction.stream);
    const int64_t jitter_us = jitter_us_for(options_.jitter_seed, index, options_.jitter_us);
    return [this, &instruction, work = std::move(work), busy, jitter_us] {
      if (jitter_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter_us));
      const Clock::time_point start = Clock::now();
      run_naming_instruction(plan_, program_, instruction, work);
      *busy += elapsed_us(start);  // one stream, one thread: no race
    };
  }

  std::function<void()> bind_work(const Instruction& instruction, size_t index) {
    switch (instruction.kind) {
      case InstructionKind::kCompute: {
        BoundOp bound = model_.bind(ref_of(instruction));
        if (!bound.compute) throw_unbound(instruction, "no computation");
        return [compute = std::move(bound.compute)] { compute(CpuBackend::Exec{}); };
      }
      case InstructionKind::kCollective: {
        BoundOp bound = model_.bind(ref_of(instruction));
        if (!bound.collective) throw_unbound(instruction, "no collective");
        if (!instruction.group) throw_unbound(instruction, "a collective without a group");
        Communicator& comm = comms_.group(*instruction.group, comm_stream(instruction));
        return [request = *bound.collective, after = std::move(bound.after_collective), &comm] {
          run_collective(request, comm);
          if (after) after(CpuBackend::Exec{});
        };
      }
      case InstructionKind::kSend: {
        Communicator& comm = comms_.point_to_point(comm_stream(instruction));
        const float* data = transfer_buffer(instruction);
        const int64_t count = model_.boundary_elements();
        return [this, index, data, count, &comm, peer = instruction.peer, tag = instruction.tag] {
          transfers_[index] = comm.start_send(data, count, peer, tag);
        };
      }
      case InstructionKind::kRecv:
        transfer_buffer(instruction);  // allocate before the receive is posted
        return [this, index] { transfers_[index]->wait(); };
    }
    return {};
  }

  [[noreturn]] void throw_unbound(const Instruction& instruction, const char* what) const {
    throw Error(ErrorCode::kInternal,
                fmt::format("{}: the model bound {} for a {} op",
                            describe_instruction(plan_, program_, instruction), what,
                            instruction_kind_name(instruction.kind)));
  }

  static OpRef ref_of(const Instruction& instruction) {
    return {.op = std::string(instruction.op),
            .layer = instruction.layer,
            .micro_batch = instruction.micro_batch};
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
      Communicator& comm = comms_.point_to_point(comm_stream(instruction));
      transfers_[i] = comm.start_recv(transfer_buffer(instruction), model_.boundary_elements(),
                                      instruction.peer, instruction.tag);
    }
  }

  void run_in_order() {
    try {
      for (auto& work : work_) work();
    } catch (...) {
      if (options_.on_failure) options_.on_failure(std::current_exception());
      throw;
    }
  }

  void run_on_streams() {
    auto failure = std::make_shared<FailureState>(options_.on_failure);
    // The three StreamClass streams in enum order, then the receive stream. Waiting for a
    // receive blocks its thread, so receives get a stream of their own: a communication
    // stream stuck on a late message would hold back the collectives queued behind it.
    // Receives complete in program order, the order the plan's tasks need them.
    constexpr size_t kReceive = kStreamClassNames.names.size();
    std::array<std::unique_ptr<Stream>, kReceive + 1> streams;
    for (StreamClass stream : kStreamClassNames.values()) {
      streams[static_cast<size_t>(stream)] =
          std::make_unique<Stream>(stream_class_name(stream), failure);
    }
    streams[kReceive] = std::make_unique<Stream>("receive", failure);
    std::vector<Completion> done(program_.instructions.size());
    for (size_t i = 0; i < program_.instructions.size(); ++i) {
      const Instruction& instruction = program_.instructions[i];
      std::vector<const Completion*> waits;
      for (int64_t dep : instruction.deps) waits.push_back(&done[static_cast<size_t>(dep)]);
      const size_t stream = instruction.kind == InstructionKind::kRecv
                                ? kReceive
                                : static_cast<size_t>(instruction.stream);
      streams[stream]->enqueue(std::move(work_[i]), std::move(waits), &done[i]);
    }
    for (auto& stream : streams) stream->drain();
    failure->rethrow_if_failed();
  }

  const Plan& plan_;
  const RankProgram& program_;
  StageModel& model_;
  CommunicatorDirectory& comms_;
  ExecutionOptions options_;
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
