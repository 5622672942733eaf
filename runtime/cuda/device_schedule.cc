#include "runtime/cuda/device_schedule.h"

#include <fmt/format.h>

#include <array>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

// The instructions receiving from `peer`, in the order of `order` (tags).
std::vector<int64_t> in_sender_order(const RankProgram& program, int64_t peer,
                                     const std::vector<int64_t>& indices,
                                     const std::vector<int64_t>& order) {
  std::map<int64_t, int64_t> by_tag;
  for (int64_t index : indices) {
    by_tag.emplace(program.instructions[static_cast<size_t>(index)].tag, index);
  }
  std::vector<int64_t> ordered;
  for (int64_t tag : order) {
    const auto it = by_tag.find(tag);
    if (it == by_tag.end()) break;
    ordered.push_back(it->second);
    by_tag.erase(it);
  }
  if (ordered.size() != indices.size() || ordered.size() != order.size()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: the send order of rank {} ({} messages) does not hold the "
                            "{} messages this program receives from it",
                            program.rank, peer, order.size(), indices.size()));
  }
  return ordered;
}

}  // namespace

DeviceSchedule schedule_device_program(const RankProgram& program, const ReceiveOrders& orders) {
  DeviceSchedule schedule;
  schedule.lowering = lower_to_streams(program);
  int64_t next_event = schedule.lowering.num_events;
  schedule.receive_event.assign(program.instructions.size(), -1);
  std::map<int64_t, std::vector<int64_t>> by_peer;  // receive instructions, program order
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& instruction = program.instructions[i];
    if (instruction.kind == InstructionKind::kRecv) {
      by_peer[instruction.peer].push_back(static_cast<int64_t>(i));
    }
  }
  for (const auto& [peer, indices] : by_peer) {
    const auto order = orders.find(peer);
    const std::vector<int64_t> posted =
        order == orders.end() ? indices : in_sender_order(program, peer, indices, order->second);
    for (int64_t index : posted) {
      schedule.receives.push_back({.instruction = index, .peer = peer, .event = next_event});
      schedule.receive_event[static_cast<size_t>(index)] = next_event++;
    }
  }
  std::array<bool, kNumDeviceStreams> used{};
  for (const StreamOp& op : schedule.lowering.ops) used[static_cast<size_t>(op.stream)] = true;
  for (int s = 0; s < kNumDeviceStreams; ++s) {
    const auto stream = static_cast<DeviceStream>(s);
    if (stream == DeviceStream::kCompute || !used[static_cast<size_t>(s)]) continue;
    schedule.join_streams.push_back(stream);
    schedule.join_events.push_back(next_event++);
  }
  schedule.num_events = next_event;
  return schedule;
}

DeviceDtype device_dtype_of(rt::ElementType type) {
  switch (type) {
    case rt::ElementType::kFloat32:
      return DeviceDtype::kFloat32;
    case rt::ElementType::kBFloat16:
      return DeviceDtype::kBFloat16;
  }
  return DeviceDtype::kFloat32;
}

}  // namespace dhelix::cuda
