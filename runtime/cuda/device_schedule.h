#pragma once
// What the CUDA executor (device_executor.h) enqueues for one rank program, as host data:
// the stream lowering (stream_lowering.h) plus the pipeline receives posted up front and
// the events that join everything at the end. Pure host logic, tested on the CPU.
//
// Receives. Every receive of the iteration is posted first on the channel stream of its
// sender (device_streams.h), in the SENDER's send order (NCCL matches a channel's
// messages in order, and the two programs may list them differently: pipeline_channels.h),
// each followed by a record of its own event, as the CPU interpreter posts its MPI
// receives before any work. At the receive's
// place in the program the lowered stream (receive in co-executed mode, compute in
// sequential mode) only waits on that event. So a receive never waits for local work (its
// buffer is written once per iteration; the previous iteration ended with a full
// synchronisation), a sender's NCCL send waits at most for earlier messages of the same
// channel, and the receive stream still completes in program order, as the lowering's
// vector clocks assume.
//
// Events: ids [0, lowering.num_events) are the lowering's; then one per receive; then one
// per stream joined into compute at the end.

#include <cstdint>
#include <vector>

#include "lib/rank_program.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/pipeline_channels.h"
#include "runtime/exec/stream_lowering.h"
#include "runtime/model/element_type.h"

namespace dhelix::cuda {

/// A receive posted at the start of the iteration.
struct PostedReceive {
  int64_t instruction = 0;  ///< index in RankProgram::instructions
  int64_t peer = -1;        ///< the sender, world rank
  int64_t event = -1;       ///< recorded on the channel stream right after the receive
};

struct DeviceSchedule {
  StreamLowering lowering;
  std::vector<PostedReceive> receives;  ///< senders ascending, each in the sender's order
  /// Per instruction: the event of its posted receive; -1 for other kinds.
  std::vector<int64_t> receive_event;
  /// Streams with work other than compute, each joined into compute at the end by
  /// recording join_events[i] on join_streams[i] and waiting on it from compute.
  std::vector<DeviceStream> join_streams;
  std::vector<int64_t> join_events;
  int64_t num_events = 0;  ///< every id above is below this
};

/// The schedule of `program` (see the file comment). A sender missing from `orders` gets
/// the program's own order. Throws Error(kInternal) when a sender's list does not hold
/// exactly the tags the program receives from it (the setup checked that it does).
DeviceSchedule schedule_device_program(const RankProgram& program,
                                       const ReceiveOrders& orders = {});

/// The NCCL element type of a model buffer's element type.
DeviceDtype device_dtype_of(rt::ElementType type);

}  // namespace dhelix::cuda
