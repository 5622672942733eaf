#pragma once
// PaddedMoeLayers' per-(micro-batch, layer) buffers (moe_layers_padded.h) and where they
// come from (moe_padded_buffers.h: the stage model's activation arena). Included at the end
// of moe_layers_padded.h only.

#include <cstdint>
#include <memory>
#include <utility>

#include "runtime/kernels/moe_padded.h"
#include "runtime/model/moe_layers_padded.h"
#include "runtime/model/moe_padded_buffers.h"

namespace dhelix::rt {

// One (micro-batch, layer)'s device buffers. R = E C = L ep C padded rows: the rank's
// permuted copies, and the own rows its local experts receive over EP; with expert tensor
// parallelism the experts compute on the TP group's etp R gathered rows (the CPU's row
// orders, moe_layers_cpu_internal.h, with every block padded).
template <class B>
struct PaddedMoeLayers<B>::State {
  int32_t* chosen = nullptr;
  float *gate = nullptr, *probs = nullptr, *aux = nullptr, *dgate = nullptr;
  uint8_t* kept = nullptr;
  int64_t *row = nullptr, *routed = nullptr, *send_counts = nullptr, *recv_counts = nullptr,
          *scratch_counts = nullptr;
  A *logits = nullptr, *dz = nullptr;                                // [T, E]
  A *permuted = nullptr, *received = nullptr, *expert_in = nullptr;  // [R, h]
  A *tp_recv = nullptr, *gathered = nullptr;                         // [etp R, h]
  A *fc1_out = nullptr, *act = nullptr;                              // [etp R, 2F], [etp R, F]
  A *expert_out = nullptr, *tp_send = nullptr;       // [etp R, h] (partial with etp)
  A* expert_own = nullptr;                           // [R, h] summed over TP
  A *expert_out_src = nullptr, *combined = nullptr;  // [R, h]
  A *d_combined = nullptr, *d_expert_out_src = nullptr, *d_expert_out = nullptr;  // [R, h]
  A *d_tp_recv = nullptr, *d_gathered = nullptr;                                  // [etp R, h]
  A *d_act = nullptr, *d_fc1 = nullptr;
  A *d_expert_in = nullptr, *d_tp_send = nullptr;  // [etp R, h] (partial with etp)
  A* d_expert_own = nullptr;                       // [R, h] summed over TP
  A *d_expert_in_src = nullptr, *d_permuted = nullptr;
  A *d_from_permute = nullptr, *d_from_router = nullptr;  // [T, h]
  // Where each stage reads. Without EP there is no all-to-all and the own rows are the
  // rank's layout (expert-major and source-major coincide with ep = 1); without expert TP
  // there is no gather and the experts compute on the own rows.
  A* own_in = nullptr;          // own rows, expert-major: expert_in or permuted
  A* experts_read = nullptr;    // gathered, or own_in
  A* own_out = nullptr;         // the experts' output of the own rows: expert_own or expert_out
  A* unpermute_read = nullptr;  // combined, or own_out
  A* own_grad = nullptr;        // d of the own rows' output: d_expert_out or d_combined
  A* experts_grad = nullptr;    // d_gathered, or own_grad
  A* own_in_grad = nullptr;     // d of the own rows' input: d_expert_own or d_expert_in
  A* permute_grad = nullptr;    // d_permuted, or own_in_grad
  kernels::MoePaddedRouting routing() const {
    return {.chosen = chosen,
            .gate = gate,
            .probs = probs,
            .kept = kept,
            .row = row,
            .routed = routed,
            .send_counts = send_counts,
            .aux_loss = aux};
  }
};

template <class B>
typename PaddedMoeLayers<B>::State& PaddedMoeLayers<B>::state(int64_t micro_batch, int64_t layer,
                                                              bool recomputing) {
  std::unique_ptr<State>& slot = (recomputing ? recompute_states_ : states_)[{micro_batch, layer}];
  if (slot) return *slot;
  slot = std::make_unique<State>();
  State& s = *slot;
  // Spans and counts as the CPU's (moe_layers_cpu.cc): of the buffers the backward reads,
  // the plan counts the experts' input, fc1's output, the activation and the combine's
  // input. Padded to the capacity, a rank's own rows are E C whatever ep (about the N k
  // copies the plan counts with capacity factor 1; E / k times them dropless), so they
  // count wholly; the gathered rows under expert TP 1/etp (the plan's sharded T k h / tp).
  typename PaddedMoeBuffers<typename B::Memory>::Scope m(buffers_, micro_batch, layer, recomputing);
  const int64_t t = shape_.tokens, h = shape_.hidden, e = shape_.experts, k = shape_.top_k;
  const int64_t rows = kernels::padded_rows(e, shape_.capacity), f = ffn_;
  const int64_t gathered = etp_ * rows;  // the rows the experts compute on
  const bool ep = ep_ > 1, etp = etp_ > 1;
  s.chosen = m.template forward<int32_t>("chosen", t * k);
  s.gate = m.template forward<float>("gate", t * k);
  s.dgate = m.template backward<float>("dgate", t * k);
  s.probs = m.template forward<float>("probs", t * e);
  s.aux = m.template kept<float>("aux", 1);          // read by aux_loss_sum
  s.kept = m.template kept<uint8_t>("kept", t * k);  // read by dropped_copies
  s.row = m.template forward<int64_t>("row", t * k);
  s.routed = m.template forward<int64_t>("routed", e);
  s.send_counts = m.template forward<int64_t>("send_counts", e);
  s.recv_counts = m.template forward<int64_t>("recv_counts", e);
  s.scratch_counts = m.template forward<int64_t>("scratch_counts", e);
  s.logits = m.template forward<A>("logits", t * e);
  s.dz = m.template backward<A>("dz", t * e);
  s.permuted = m.template forward<A>("permuted", rows * h, !ep && !etp ? 1 : 0);
  s.d_combined = m.template backward<A>("d_combined", rows * h);
  s.expert_out = m.template forward<A>("expert_out", gathered * h, !ep && !etp ? 1 : 0);
  s.d_expert_in = m.template backward<A>("d_expert_in", gathered * h);
  s.fc1_out = m.template forward<A>("fc1_out", gathered * 2 * f, 1);
  s.d_fc1 = m.template backward<A>("d_fc1", gathered * 2 * f);
  s.act = m.template forward<A>("act", gathered * f, 1);
  s.d_act = m.template backward<A>("d_act", gathered * f);
  s.d_from_permute = m.template backward<A>("d_from_permute", t * h);
  s.d_from_router = m.template backward<A>("d_from_router", t * h);
  if (ep) {
    s.received = m.template forward<A>("received", rows * h);
    s.expert_in = m.template forward<A>("expert_in", rows * h, etp ? 0 : 1);
    s.expert_out_src = m.template forward<A>("expert_out_src", rows * h);
    s.combined = m.template forward<A>("combined", rows * h, 1);
    for (auto [buffer, name] : {std::pair{&s.d_expert_out_src, "d_expert_out_src"},
                                std::pair{&s.d_expert_out, "d_expert_out"},
                                std::pair{&s.d_expert_in_src, "d_expert_in_src"},
                                std::pair{&s.d_permuted, "d_permuted"}}) {
      *buffer = m.template backward<A>(name, rows * h);
    }
  }
  if (etp) {
    s.tp_send = m.template forward<A>("tp_send", gathered * h);
    s.tp_recv = m.template forward<A>("tp_recv", gathered * h);
    s.gathered = m.template forward<A>("gathered", gathered * h, etp_);
    s.d_tp_send = m.template backward<A>("d_tp_send", gathered * h);
    s.d_tp_recv = m.template backward<A>("d_tp_recv", gathered * h);
    s.d_gathered = m.template backward<A>("d_gathered", gathered * h);
    s.expert_own = m.template forward<A>("expert_own", rows * h, !ep ? 1 : 0);
    s.d_expert_own = m.template backward<A>("d_expert_own", rows * h);
  }
  s.own_in = ep ? s.expert_in : s.permuted;
  s.experts_read = etp ? s.gathered : s.own_in;
  s.own_out = etp ? s.expert_own : s.expert_out;
  s.unpermute_read = ep ? s.combined : s.own_out;
  s.own_grad = ep ? s.d_expert_out : s.d_combined;
  s.experts_grad = etp ? s.d_gathered : s.own_grad;
  s.own_in_grad = etp ? s.d_expert_own : s.d_expert_in;
  s.permute_grad = ep ? s.d_permuted : s.own_in_grad;
  return s;
}

}  // namespace dhelix::rt
