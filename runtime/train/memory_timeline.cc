// Activation bytes live over a traced step (memory_timeline.h).
#include "runtime/train/memory_timeline.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>

namespace dhelix::rt {
namespace {

using InstructionKey =
    std::tuple<InstructionKind, std::string_view, int64_t, int64_t, int64_t, bool, int64_t>;

InstructionKey key_of(const Instruction& in) {
  return {in.kind, in.op, in.layer, in.micro_batch, in.task, in.gradient, in.tag};
}

}  // namespace

std::vector<int64_t> instruction_map(const RankProgram& reference, const RankProgram& traced) {
  if (reference.instructions.size() != traced.instructions.size()) return {};
  std::map<InstructionKey, std::vector<int64_t>> places;  // in traced order
  for (size_t i = 0; i < traced.instructions.size(); ++i) {
    places[key_of(traced.instructions[i])].push_back(static_cast<int64_t>(i));
  }
  std::map<InstructionKey, size_t> used;
  std::vector<int64_t> map;
  for (const Instruction& in : reference.instructions) {
    const InstructionKey key = key_of(in);
    const auto it = places.find(key);
    size_t& n = used[key];
    if (it == places.end() || n >= it->second.size()) return {};
    map.push_back(it->second[n++]);
  }
  return map;
}

std::vector<MemorySample> activation_timeline(const MemoryReport& report,
                                              const std::vector<OpTiming>& ops,
                                              const std::vector<int64_t>& map,
                                              int64_t iteration_start_ns,
                                              int64_t iteration_end_ns) {
  const auto timing = [&](int64_t instruction) -> const OpTiming* {
    if (!map.empty()) {
      if (instruction < 0 || instruction >= static_cast<int64_t>(map.size())) return nullptr;
      instruction = map[static_cast<size_t>(instruction)];
    }
    if (instruction < 0 || instruction >= static_cast<int64_t>(ops.size())) return nullptr;
    return &ops[static_cast<size_t>(instruction)];
  };
  const auto clamp = [&](int64_t ns) {
    return std::clamp(ns, iteration_start_ns, std::max(iteration_start_ns, iteration_end_ns));
  };
  std::map<int64_t, int64_t> change;  // time -> bytes becoming live (negative: dead)
  change[iteration_start_ns] += 0;
  for (const ArenaBufferRecord& b : report.buffers) {
    const OpTiming* first = timing(b.first_instruction);
    const OpTiming* last = timing(b.last_instruction);
    if (first == nullptr || last == nullptr) {
      change[iteration_start_ns] += b.bytes;
      change[clamp(iteration_end_ns)] -= b.bytes;
      continue;
    }
    change[clamp(std::min(first->start_ns, last->start_ns))] += b.bytes;
    change[clamp(std::max(first->end_ns, last->end_ns))] -= b.bytes;
  }
  // Every buffer's bytes come and go once: the last sample is 0.
  std::vector<MemorySample> samples;
  int64_t live = 0;
  for (const auto& [time_ns, delta] : change) {
    live += delta;
    if (!samples.empty() && samples.back().bytes == live) continue;
    samples.push_back({time_ns, live});
  }
  return samples;
}

}  // namespace dhelix::rt
