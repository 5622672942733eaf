#pragma once
// How a rank program (lib/plan/rank_program.h) runs on streams: which stream each instruction
// is enqueued on, and which event records and waits make the program's dependencies hold,
// with as few events as the program allows and no host synchronisation anywhere inside an
// iteration. Pure host data, used by both executors: the CUDA executor
// (runtime/cuda/device_executor.h) walks `ops` in order and, for each, waits on its events
// (cudaStreamWaitEvent), enqueues the instruction's kernels or NCCL calls, then records its
// event (cudaEventRecord); the CPU interpreter (interpreter.h) runs each stream as a thread
// and makes an instruction wait for exactly the same events, so that every CPU run of a
// co-executed program (dhelix-run --verify among them) checks the lowering the GPU uses.
//
// Streams (the DHelix paper's three, plus receives):
//   compute    (normal priority): compute ops;
//   local_comm (high priority):   collectives the plan puts on the local stream;
//   cross_comm (high priority):   collectives on the cross stream, pipeline sends;
//   receive    (high priority):   pipeline receives, apart so that a late message holds back
//                                 no collective (as in runtime/exec/interpreter.cc).
// Communication streams get the higher priority so that a collective's kernels are
// scheduled ahead of a GEMM's waiting blocks: the collective is on the critical path of the
// other strand. Sequential mode (dhelix-run --verify's reference) runs everything on the
// compute stream and needs no event.
//
// Which dependencies need a wait. Instructions are enqueued in program order and every
// dependency points backwards, so a dependency on an earlier instruction of the same
// stream holds by stream order. For another stream the lowering keeps a vector clock per
// stream: entry t is the last position on stream t that this stream is already ordered
// after (through earlier waits, transitively). A dependency already covered is skipped;
// of the rest, only the latest per producer stream is kept, and one made redundant by
// another's clock is dropped. Example: A (compute), B (local_comm, after A), C (cross_comm,
// after A and B): C waits only on B's event, because B already waited on A.
// Events are recorded right after their producer, which is always enqueued before its
// consumer, so no wait ever refers to an event recorded later.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/memory/buffer_spans.h"

namespace dhelix::rt {

/// The streams of one rank, in index order.
enum class DeviceStream { kCompute = 0, kLocalComm = 1, kCrossComm = 2, kReceive = 3 };
inline constexpr int kNumDeviceStreams = 4;
inline constexpr EnumNames<DeviceStream, kNumDeviceStreams> kDeviceStreamNames{
    {"compute", "local_comm", "cross_comm", "receive"}};
/// "compute", "local_comm", "cross_comm", "receive".
constexpr const char* device_stream_name(DeviceStream stream) {
  return kDeviceStreamNames.name(stream);
}
/// Whether the stream is created with the device's greatest priority (comm streams).
bool device_stream_high_priority(DeviceStream stream);

/// One instruction as the executor enqueues it.
struct StreamOp {
  int64_t instruction = 0;  ///< index in RankProgram::instructions
  DeviceStream stream = DeviceStream::kCompute;
  std::vector<int64_t> wait_events;  ///< cudaStreamWaitEvent on these before the op
  int64_t record_event = -1;         ///< cudaEventRecord after the op; -1: none
};

struct StreamLowering {
  std::vector<StreamOp> ops;  ///< program order = enqueue order
  int64_t num_events = 0;     ///< event ids are 0 .. num_events - 1, one record each
  int64_t num_waits = 0;
  int64_t deps_same_stream = 0;   ///< dependencies held by stream order
  int64_t deps_already_held = 0;  ///< dependencies held by an earlier wait (transitively)
};

/// The stream an instruction runs on in co-executed mode (see the file comment). Throws
/// Error(kInvalidInput) for a stream name the runtime does not know.
DeviceStream stream_of(const Instruction& instruction);

/// Lowers `program` onto streams and events (see the file comment). Aborts (DHELIX_CHECK)
/// on a dependency that does not point to an earlier instruction.
StreamLowering lower_to_streams(const RankProgram& program);

/// The order the executors give `program`'s instructions (runtime/memory/buffer_spans.h,
/// for the activation arena's lifetimes): co-executed, the lowering's streams and event
/// waits; sequential, program order on one stream.
ProgramOrder program_order(const RankProgram& program);
/// program_order of each program.
std::vector<ProgramOrder> program_orders(const std::vector<const RankProgram*>& programs);

}  // namespace dhelix::rt

// The CUDA executor's names for the same things.
namespace dhelix::cuda {
using rt::device_stream_high_priority;
using rt::device_stream_name;
using rt::DeviceStream;
using rt::kNumDeviceStreams;
using rt::lower_to_streams;
using rt::stream_of;
using rt::StreamLowering;
using rt::StreamOp;
}  // namespace dhelix::cuda
