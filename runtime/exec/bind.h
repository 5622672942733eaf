#pragma once
// The bind step both executors share (runtime/exec/interpreter.cc on the CPU,
// runtime/cuda/device_executor.cc on GPUs): every instruction of a rank program is bound to
// the model before any work starts, on the calling thread, so that no buffer is allocated
// and no communicator is looked up while work runs.
//   compute     the model's closure (BoundOp::compute), which must exist;
//   collective  the model's request (BoundOp::collective), which must exist, and the
//               communicator the executor gives for (group, stream);
//   send, recv  the residual-stream buffer the transfer moves (allocated now) and the
//               executor's point-to-point communicator for the peer.
// A failure names the instruction (runtime/exec/instruction_errors.h). The executors differ
// only in how they run what is bound: threads and MPI on the CPU, streams and NCCL on GPUs.

#include <fmt/format.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"
#include "runtime/exec/instruction_errors.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// The model's name for the op an instruction runs.
inline OpRef op_ref_of(const Instruction& instruction) {
  return {.op = std::string(instruction.op),
          .layer = instruction.layer,
          .micro_batch = instruction.micro_batch};
}

/// One instruction, bound.
template <class BoundOp, class Comm>
struct BoundInstruction {
  BoundOp op;              ///< compute and collective instructions
  Comm* comm = nullptr;    ///< collectives and transfers
  void* buffer = nullptr;  ///< transfers: the residual-stream buffer
};

/// Binds every instruction of `program` in program order (see the file comment).
/// `comm_for(instruction)` returns the communicator (Comm*) of a collective, send or
/// receive. Throws the first failure, naming the instruction.
template <class Comm, class Model, class CommFor>
std::vector<BoundInstruction<typename Model::BoundOp, Comm>> bind_program(
    const Plan& plan, const RankProgram& program, Model& model, CommFor&& comm_for) {
  std::vector<BoundInstruction<typename Model::BoundOp, Comm>> bound(program.instructions.size());
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& instruction = program.instructions[i];
    auto& out = bound[i];
    run_naming_instruction(plan, program, instruction, [&] {
      const auto unbound = [&](const char* what) {
        return Error(ErrorCode::kInternal, fmt::format("the model bound {} for a {} op", what,
                                                       instruction_kind_name(instruction.kind)));
      };
      switch (instruction.kind) {
        case InstructionKind::kCompute:
          out.op = model.bind(op_ref_of(instruction));
          if (!out.op.compute) throw unbound("no computation");
          return;
        case InstructionKind::kCollective:
          out.op = model.bind(op_ref_of(instruction));
          if (!out.op.collective) throw unbound("no collective");
          out.comm = comm_for(instruction);
          return;
        case InstructionKind::kSend:
        case InstructionKind::kRecv:
          out.buffer =
              instruction.gradient
                  ? static_cast<void*>(
                        model.residual_grad(instruction.micro_batch, instruction.layer))
                  : static_cast<void*>(model.residual(instruction.micro_batch, instruction.layer));
          out.comm = comm_for(instruction);
          return;
      }
    });
  }
  return bound;
}

/// The one switch over collective kinds: calls comm.all_gather(request),
/// comm.reduce_scatter_sum(request), comm.all_reduce_sum(request) or
/// comm.ring_exchange(request) or comm.all_to_all_v(request) with `extra` after it (the
/// device executor's stream). A Comm without ring_exchange throws Error(kUnsupported) for
/// the CP ring's step.
template <class Comm, class... Extra>
void run_collective(const CollectiveRequest& request, Comm& comm, Extra&&... extra) {
  switch (request.kind) {
    case CollectiveKind::kAllGather:
      comm.all_gather(request, std::forward<Extra>(extra)...);
      return;
    case CollectiveKind::kReduceScatter:
      comm.reduce_scatter_sum(request, std::forward<Extra>(extra)...);
      return;
    case CollectiveKind::kAllReduce:
      comm.all_reduce_sum(request, std::forward<Extra>(extra)...);
      return;
    case CollectiveKind::kRingExchange:
      if constexpr (requires { comm.ring_exchange(request, std::forward<Extra>(extra)...); }) {
        comm.ring_exchange(request, std::forward<Extra>(extra)...);
        return;
      } else {
        throw Error(ErrorCode::kUnsupported,
                    "the context-parallel ring's step is not run by this backend yet");
      }
    case CollectiveKind::kAllToAllV:
      comm.all_to_all_v(request, std::forward<Extra>(extra)...);
      return;
  }
}

}  // namespace dhelix::rt
