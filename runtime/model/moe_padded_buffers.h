#pragma once
// Where the padded MoE layers (moe_layers_padded.h, moe_shared_expert_padded.h) get their
// per-(micro-batch, layer) buffers: the stage model's activation arena
// (activation_arena.h), with the spans the CPU's MoE layers give theirs
// (moe_layers_cpu.cc, MoeLayersCpu::state), so that a device rank allocates nothing once its
// activations are laid out, MoE plans included.
//
// Spans: the forward's buffers live to the layer's backward (kLayerSaved); in full
// recompute's first pass they die with the forward (kMlpForward) and the repeat's live in
// the backward (kLayerBackward); gradient buffers live in the MLP block's backward
// (kMlpBackward). Names carry "moe." or "re.moe." (the repeat's second set), as the CPU's.
//
// Two small buffers are read between iterations, not by an op: the router's
// load-balancing loss (aux_loss_sum) and its kept flags (dropped_copies). An arena buffer's
// bytes serve another buffer after its last reader in the iteration, so these two are
// allocated from the model's memory instead, once per (micro-batch, layer, set), and kept
// when the arena's layout pass forgets the states (keep()): the layout pass makes them, the
// executors' binding finds them, and no iteration allocates.
//
// Without an arena (a unit test binding ops by hand) every buffer is an allocation of the
// memory's own, as before the arena.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>

#include "runtime/memory/buffer_spans.h"
#include "runtime/model/activation_arena.h"

namespace dhelix::rt {

template <class Memory>
class PaddedMoeBuffers {
 public:
  PaddedMoeBuffers(Memory& memory, bool full_recompute)
      : memory_(memory), full_recompute_(full_recompute) {}

  /// Buffers from now on come from `arena` (the stage model's; outlives this).
  void set_arena(ActivationArena<Memory>* arena) { arena_ = arena; }

  /// The buffers of one (micro-batch, layer) and set (`recomputing`: full recompute's
  /// second set), as the CPU's spans (see the file comment).
  class Scope {
   public:
    Scope(PaddedMoeBuffers& owner, int64_t micro_batch, int64_t layer, bool recomputing)
        : owner_(owner),
          micro_batch_(micro_batch),
          layer_(layer),
          recomputing_(recomputing),
          first_pass_(owner.full_recompute_ && !recomputing),
          prefix_(recomputing ? "re.moe." : "moe.") {}
    /// A buffer the backward reads of the forward (or the repeat's); `counted_share`: the
    /// plan counts bytes / counted_share of it (0: none); none in full recompute's first
    /// pass, whose forward keeps nothing.
    template <class T>
    T* forward(std::string_view name, int64_t count, int64_t counted_share = 0) {
      const SpanKind kind = recomputing_  ? SpanKind::kLayerBackward
                            : first_pass_ ? SpanKind::kMlpForward
                                          : SpanKind::kLayerSaved;
      return get<T>(kind, name, count, first_pass_ ? 0 : counted_share);
    }
    /// A gradient buffer of the MLP block's backward.
    template <class T>
    T* backward(std::string_view name, int64_t count) {
      return get<T>(first_pass_ ? SpanKind::kMlpForward : SpanKind::kMlpBackward, name, count, 0);
    }
    /// A buffer read between iterations (see the file comment): outside the arena.
    template <class T>
    T* kept(std::string_view name, int64_t count) {
      void*& slot = owner_.kept_[{micro_batch_, layer_, recomputing_, std::string(name)}];
      if (slot == nullptr) slot = owner_.memory_.template allocate<T>(count);
      return static_cast<T*>(slot);
    }

   private:
    template <class T>
    T* get(SpanKind kind, std::string_view name, int64_t count, int64_t counted_share) {
      if (owner_.arena_ == nullptr) return owner_.memory_.template allocate<T>(count);
      return owner_.arena_->template allocate<T>({kind, micro_batch_, layer_},
                                                 prefix_ + std::string(name), count, counted_share);
    }

    PaddedMoeBuffers& owner_;
    int64_t micro_batch_;
    int64_t layer_;
    bool recomputing_;
    bool first_pass_;
    std::string prefix_;
  };

 private:
  Memory& memory_;
  bool full_recompute_;
  ActivationArena<Memory>* arena_ = nullptr;
  // (micro-batch, layer, recomputing, name) -> a buffer outside the arena
  std::map<std::tuple<int64_t, int64_t, bool, std::string>, void*> kept_;
};

}  // namespace dhelix::rt
