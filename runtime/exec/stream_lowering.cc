#include "runtime/exec/stream_lowering.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

// Position on each stream (1-based; 0 = nothing) that a point of execution is ordered after.
using Clock = std::array<int64_t, kNumDeviceStreams>;

int index_of(DeviceStream stream) { return static_cast<int>(stream); }

void merge(Clock& into, const Clock& other) {
  for (int s = 0; s < kNumDeviceStreams; ++s) into[s] = std::max(into[s], other[s]);
}

}  // namespace

bool device_stream_high_priority(DeviceStream stream) { return stream != DeviceStream::kCompute; }

DeviceStream stream_of(const Instruction& instruction) {
  if (instruction.kind == InstructionKind::kRecv) return DeviceStream::kReceive;
  switch (instruction.stream) {
    case StreamClass::kCompute:
      return DeviceStream::kCompute;
    case StreamClass::kLocalComm:
      return DeviceStream::kLocalComm;
    case StreamClass::kCrossComm:
      return DeviceStream::kCrossComm;
  }
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{} (layer {}, micro-batch {}): a stream outside StreamClass",
                          instruction.op, instruction.layer, instruction.micro_batch));
}

StreamLowering lower_to_streams(const RankProgram& program) {
  const size_t n = program.instructions.size();
  const bool sequential = program.mode == ExecutionMode::kSequential;
  StreamLowering lowering;
  lowering.ops.resize(n);
  std::vector<int64_t> position(n, 0);  // 1-based position of an instruction on its stream
  std::vector<Clock> after(n);          // the clock of its stream right after it
  Clock zero{};
  std::array<Clock, kNumDeviceStreams> stream_clock{};
  stream_clock.fill(zero);
  for (size_t i = 0; i < n; ++i) {
    const Instruction& instruction = program.instructions[i];
    StreamOp& op = lowering.ops[i];
    op.instruction = static_cast<int64_t>(i);
    op.stream = sequential ? DeviceStream::kCompute : stream_of(instruction);
    const int s = index_of(op.stream);
    Clock& clock = stream_clock[s];
    // The latest not-yet-covered dependency per producer stream.
    std::array<int64_t, kNumDeviceStreams> needed;
    needed.fill(-1);
    for (int64_t dep : instruction.deps) {
      DHELIX_CHECK(dep >= 0 && static_cast<size_t>(dep) < i);
      const int t = index_of(lowering.ops[static_cast<size_t>(dep)].stream);
      if (t == s) {
        ++lowering.deps_same_stream;
      } else if (clock[t] >= position[static_cast<size_t>(dep)]) {
        ++lowering.deps_already_held;
      } else if (needed[t] < 0 ||
                 position[static_cast<size_t>(dep)] > position[static_cast<size_t>(needed[t])]) {
        if (needed[t] >= 0) ++lowering.deps_already_held;  // the later one covers it
        needed[t] = dep;
      } else {
        ++lowering.deps_already_held;
      }
    }
    // Drop a needed producer another needed producer's clock already covers.
    for (int t = 0; t < kNumDeviceStreams; ++t) {
      if (needed[t] < 0) continue;
      for (int u = 0; u < kNumDeviceStreams; ++u) {
        if (u == t || needed[u] < 0) continue;
        if (after[static_cast<size_t>(needed[u])][t] >= position[static_cast<size_t>(needed[t])]) {
          needed[t] = -1;
          ++lowering.deps_already_held;
          break;
        }
      }
    }
    for (int t = 0; t < kNumDeviceStreams; ++t) {
      if (needed[t] < 0) continue;
      StreamOp& producer = lowering.ops[static_cast<size_t>(needed[t])];
      if (producer.record_event < 0) producer.record_event = lowering.num_events++;
      op.wait_events.push_back(producer.record_event);
      ++lowering.num_waits;
      merge(clock, after[static_cast<size_t>(needed[t])]);
    }
    position[i] = clock[s] + 1;
    clock[s] = position[i];
    after[i] = clock;
  }
  return lowering;
}

static_assert(kNumDeviceStreams <= kMaxStreams);

ProgramOrder program_order(const RankProgram& program) {
  if (program.mode == ExecutionMode::kSequential) {
    return ProgramOrder::sequential(static_cast<int64_t>(program.instructions.size()));
  }
  const StreamLowering lowering = lower_to_streams(program);
  std::vector<int64_t> producer(static_cast<size_t>(lowering.num_events), -1);
  std::vector<OrderedInstruction> ordered(program.instructions.size());
  for (const StreamOp& op : lowering.ops) {
    OrderedInstruction& o = ordered[static_cast<size_t>(op.instruction)];
    o.stream = static_cast<int>(op.stream);
    for (const int64_t event : op.wait_events) {
      o.waits.push_back(producer[static_cast<size_t>(event)]);
    }
    if (op.record_event >= 0) producer[static_cast<size_t>(op.record_event)] = op.instruction;
  }
  return ProgramOrder(ordered);
}

std::vector<ProgramOrder> program_orders(const std::vector<const RankProgram*>& programs) {
  std::vector<ProgramOrder> orders;
  for (const RankProgram* program : programs) orders.push_back(program_order(*program));
  return orders;
}

}  // namespace dhelix::rt
