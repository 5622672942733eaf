#include "runtime/model/activation_arena.h"

#include <algorithm>
#include <cstdlib>

namespace dhelix::rt {

bool activation_arena_wanted() {
  const char* value = std::getenv("DHELIX_ACTIVATION_ARENA");
  if (value == nullptr || std::string_view(value) == "arena") return true;
  if (std::string_view(value) == "separate") return false;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("DHELIX_ACTIVATION_ARENA={}: must be \"arena\" (the default) or "
                          "\"separate\" (one allocation per buffer, for debugging)",
                          value));
}

void ArenaLayout::record(const SpanKey& key, std::string_view name, int64_t bytes,
                         int64_t counted) {
  Block& block = blocks_[key];
  const auto [it, inserted] =
      block.buffers.try_emplace(std::string(name), Buffer{bytes, 0, counted});
  if (inserted) {
    it->second.offset_in_block = block.bytes;
    block.bytes += align_up(bytes, kArenaAlignment);
  } else if (it->second.bytes != bytes) {
    throw Error(ErrorCode::kInternal,
                fmt::format("activation arena: buffer {}.{} asked for with {} and {} bytes",
                            span_name(key), name, it->second.bytes, bytes));
  }
}

void ArenaLayout::place(const std::vector<const RankProgram*>& programs,
                        const std::vector<ProgramOrder>& orders, int64_t num_layers,
                        const ExtraOwnerOf& extra_owner) {
  DHELIX_CHECK(!programs.empty() && programs.size() == orders.size());
  std::vector<Block*> blocks;
  std::vector<SpanKey> keys;
  for (auto& [key, block] : blocks_) {
    blocks.push_back(&block);
    keys.push_back(key);
  }
  const size_t n = blocks.size();
  // conflict[i * n + j]: blocks i and j may be in use at once in some program.
  std::vector<char> conflict(n * n, 0);
  for (size_t p = 0; p < programs.size(); ++p) {
    const ProgramOrder& order = orders[p];
    const std::map<SpanKey, SpanUses> uses =
        span_uses(*programs[p], order, num_layers, extra_owner);
    std::vector<const SpanUses*> of(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const auto found = uses.find(keys[i]);
      if (found != uses.end()) of[i] = &found->second;
    }
    if (p == 0) {
      for (size_t i = 0; i < n; ++i) {
        if (of[i] != nullptr) blocks[i]->reported = *of[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = i + 1; j < n; ++j) {
        if (of[i] == nullptr || of[j] == nullptr) continue;  // one unused in this program
        if (!ordered_before(*of[i], *of[j], order) && !ordered_before(*of[j], *of[i], order)) {
          conflict[i * n + j] = conflict[j * n + i] = 1;
        }
      }
    }
  }
  std::vector<int64_t> bytes(n);
  std::vector<ProgramInterval> intervals(n);
  for (size_t i = 0; i < n; ++i) {
    bytes[i] = blocks[i]->bytes;
    const SpanUses& u = blocks[i]->reported;
    intervals[i] = {u.from_start ? 0 : std::max<int64_t>(u.first, 0), std::max<int64_t>(u.last, 0)};
  }
  const ArenaPlacement placement = pack_blocks(
      bytes, [&](size_t i, size_t j) { return conflict[i * n + j] != 0; }, kArenaAlignment);
  for (size_t i = 0; i < n; ++i) blocks[i]->offset = placement.offsets[i];
  arena_bytes_ = placement.arena_bytes;
  live_peak_bytes_ = live_peak_bytes(bytes, intervals);
  std::vector<int64_t> counted(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [name, buffer] : blocks[i]->buffers) {
      counted[i] += buffer.counted;
    }
  }
  // The plan holds a received activation from its arrival, not from the iteration's start
  // where the runtime posts its receive: the count's intervals start at the first use.
  for (size_t i = 0; i < n; ++i)
    intervals[i].first = std::max<int64_t>(blocks[i]->reported.first, 0);
  counted_peak_bytes_ = live_peak_bytes(counted, intervals);
}

int64_t ArenaLayout::offset_of(const SpanKey& key, std::string_view name, int64_t bytes) const {
  const auto block = blocks_.find(key);
  const auto buffer = block == blocks_.end() ? decltype(block->second.buffers.end()){}
                                             : block->second.buffers.find(name);
  if (block == blocks_.end() || buffer == block->second.buffers.end() ||
      buffer->second.bytes != bytes) {
    throw Error(ErrorCode::kInternal,
                fmt::format("activation arena: buffer {}.{} ({} bytes) was not laid out",
                            span_name(key), name, bytes));
  }
  return block->second.offset + buffer->second.offset_in_block;
}

void ArenaLayout::fill_report(MemoryReport& report) const {
  report.activation_arena_bytes = arena_bytes_;
  report.activation_live_peak_bytes = live_peak_bytes_;
  report.activation_counted_peak_bytes = counted_peak_bytes_;
  report.buffers.clear();
  for (const auto& [key, block] : blocks_) {
    for (const auto& [name, buffer] : block.buffers) {
      // Unused by the reported program: held all iteration as far as it can tell. A received
      // buffer is live from the start (its receive is posted then).
      const SpanUses& u = block.reported;
      const bool unused = u.first < 0;
      report.buffers.push_back(
          ArenaBufferRecord{.name = span_name(key) + "." + name,
                            .offset = block.offset + buffer.offset_in_block,
                            .bytes = buffer.bytes,
                            .first_instruction = unused ? -1 : (u.from_start ? 0 : u.first),
                            .last_instruction = unused ? -1 : u.last,
                            .counted_bytes = buffer.counted});
    }
  }
}

}  // namespace dhelix::rt
