#pragma once
// Where a stage model's activation buffers live: one arena per rank, laid out before the
// first step from the rank programs (runtime/memory/buffer_spans.h for the lifetimes,
// runtime/memory/arena_plan.h for the offsets).
//
// The layer code asks for a buffer by span and name (allocate(key, "q", count)); it never
// owns one. The arena answers in one of three modes:
//   separate  each buffer its own allocation, never freed (the model before plan(); unit
//             tests that bind ops by hand, and DHELIX_ACTIVATION_ARENA=separate, the
//             debugging reference every arena run must equal bit for bit);
//   layout    a fake address, never dereferenced, while the model binds every
//             instruction once to say which buffers exist: (span, name, bytes);
//   placed    the buffer's place in the arena: a second binding of the same instructions
//             asks for the same (span, name) pairs and gets their planned addresses.
// Buffers of one span have the same lifetime and are laid out back to back in one block;
// the blocks are what the arena packs. A buffer asked for in placed mode that the layout
// did not see is an internal error (the two bindings differ), never a silent allocation.
//
// Bytes are poisoned with all-ones (a NaN in fp32 and bf16) when the arena is laid out, so
// an op reading a buffer no op wrote reads NaN on its first iteration instead of zeros.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/memory/arena_plan.h"
#include "runtime/memory/buffer_spans.h"
#include "runtime/memory/memory_report.h"

namespace dhelix::rt {

/// Offsets within the arena are multiples of this (a CUDA allocation's alignment; wider
/// than any vector load on the CPU).
inline constexpr int64_t kArenaAlignment = 256;

/// False when the environment says DHELIX_ACTIVATION_ARENA=separate (the file comment's
/// debugging reference); true when it is unset or "arena". Error(kInvalidInput) naming the
/// variable for any other value.
bool activation_arena_wanted();

/// The arena's lay-out, backend-neutral: which (span, name) buffers exist, their blocks and
/// offsets (activation_arena.cc).
class ArenaLayout {
 public:
  /// Records a buffer in layout mode; `counted`: ArenaBufferRecord::counted_bytes.
  void record(const SpanKey& key, std::string_view name, int64_t bytes, int64_t counted);
  bool empty() const { return blocks_.empty(); }
  /// Packs the recorded blocks for `programs` (every one the rank runs), each in its
  /// executors' order (`orders`, runtime/exec/stream_lowering.h's program_order). Afterwards
  /// offset_of answers.
  void place(const std::vector<const RankProgram*>& programs,
             const std::vector<ProgramOrder>& orders, int64_t num_layers,
             const ExtraOwnerOf& extra_owner);
  /// The planned offset of (key, name); Error(kInternal) if the layout did not record it
  /// or recorded another size.
  int64_t offset_of(const SpanKey& key, std::string_view name, int64_t bytes) const;
  int64_t arena_bytes() const { return arena_bytes_; }
  /// The report's activation part: arena, live peak, buffers (positions in `reported`,
  /// the first program given to place()).
  void fill_report(MemoryReport& report) const;

 private:
  struct Buffer {
    int64_t bytes = 0;
    int64_t offset_in_block = 0;
    int64_t counted = 0;
  };
  struct Block {
    std::map<std::string, Buffer, std::less<>> buffers;
    int64_t bytes = 0;
    int64_t offset = 0;
    SpanUses reported;  ///< uses in the first program
  };
  std::map<SpanKey, Block> blocks_;
  int64_t arena_bytes_ = 0;
  int64_t live_peak_bytes_ = 0;
  int64_t counted_peak_bytes_ = 0;
};

/// The model's allocator of activation buffers over backend memory B::Memory.
template <class Memory>
class ActivationArena {
 public:
  explicit ActivationArena(Memory& memory) : memory_(memory) {}

  /// `counted_share`: the plan's activation model counts bytes / counted_share of the
  /// buffer (memory_report.h's counted_bytes); 0: none of it.
  template <class T>
  T* allocate(const SpanKey& key, std::string_view name, int64_t count, int64_t counted_share) {
    const int64_t bytes = std::max<int64_t>(count, 1) * static_cast<int64_t>(sizeof(T));
    switch (mode_) {
      case Mode::kSeparate:
        return memory_.template allocate<T>(count);
      case Mode::kLayout: {
        layout_.record(key, name, bytes, counted_share > 0 ? bytes / counted_share : 0);
        // A distinct, aligned, unmapped address: a dereference faults at once.
        next_fake_ = align_up(next_fake_ + bytes, kArenaAlignment);
        return reinterpret_cast<T*>(static_cast<uintptr_t>(next_fake_));
      }
      case Mode::kPlaced:
        return reinterpret_cast<T*>(base_ + layout_.offset_of(key, name, bytes));
    }
    return nullptr;
  }

  bool placed() const { return mode_ == Mode::kPlaced; }
  /// Starts the layout: the caller then binds every instruction, calls place(), drops what
  /// it bound and binds again.
  void begin_layout() {
    DHELIX_CHECK(mode_ == Mode::kSeparate);
    mode_ = Mode::kLayout;
  }
  /// Plans the offsets, allocates the arena and poisons it (see the file comment).
  void place(const std::vector<const RankProgram*>& programs,
             const std::vector<ProgramOrder>& orders, int64_t num_layers,
             const ExtraOwnerOf& extra_owner) {
    DHELIX_CHECK(mode_ == Mode::kLayout);
    layout_.place(programs, orders, num_layers, extra_owner);
    base_ = memory_.template allocate<std::byte>(std::max<int64_t>(layout_.arena_bytes(), 1));
    memory_.poison(base_, layout_.arena_bytes());
    mode_ = Mode::kPlaced;
  }
  /// The activation part of the rank's memory report (zero before place()).
  void fill_report(MemoryReport& report) const {
    if (mode_ == Mode::kPlaced) layout_.fill_report(report);
  }

 private:
  enum class Mode { kSeparate, kLayout, kPlaced };
  Memory& memory_;
  Mode mode_ = Mode::kSeparate;
  ArenaLayout layout_;
  std::byte* base_ = nullptr;
  // Fake addresses start far above any mapping a process gets at start-up (1 TiB).
  int64_t next_fake_ = int64_t{1} << 40;
};

}  // namespace dhelix::rt
