#pragma once
// MoeLayersCpu's weights and per-(micro-batch, layer) buffers, shared by moe_layers_cpu.cc
// (the router, permutations, EP all-to-alls and grouped GEMMs) and moe_expert_tp_cpu.cc
// (expert tensor parallelism's TP exchanges). Included by those two files only.
//
// Row orders. "Rank layout" is permute's order of this rank's kept copies. The copies that
// reach a TP rank's experts are held in two orders: "source-major" (by sending member, then
// local expert: what an all-to-all delivers) and "expert-major" (by local expert, then
// sending member: what the grouped GEMMs read). Two stages have members:
//   EP   the dispatch brings every EP member's copies for the local experts ("own rows":
//        this TP rank's share of the tokens);
//   ETP  with expert tensor parallelism (etp = tp > 1) every TP member then receives the
//        own rows of all TP members ("gathered rows"), since each holds 1/etp of every
//        local expert's FFN columns; the partial expert outputs go back to the member whose
//        rows they are and are summed there in TP rank order.
// Without a stage (ep = 1, etp = 1) its buffers are not used and the pointers below alias
// the buffers on its other side.

#include <cstdint>
#include <vector>

#include "runtime/cpu/moe_cpu.h"
#include "runtime/model/moe_layers_cpu.h"

namespace dhelix::rt {

struct MoeLayersCpu::Weights {
  std::vector<float> router, fc1, fc2;  // [E, h], [L, 2F/etp, h], [L, h, F/etp]
  // The shared expert (empty without one): gate [h], fc1 [2Fs/tp, h], fc2 [h, Fs/tp].
  std::vector<float> shared_gate, shared_fc1, shared_fc2;
  std::vector<float> d_shared_gate, d_shared_fc1, d_shared_fc2;
  std::vector<float> d_router, d_fc1, d_fc2;
};

// One (micro-batch, layer)'s buffers, sized at their bounds once (closures keep pointers):
// N tokens on this rank (T / tp with SP), N k copies leave it, at most ep N k own rows
// arrive, etp times those are gathered. F here is the local FFN width F_e / etp.
/// A float buffer from the MoE layers' allocator (MoeLayersCpu::set_allocator: the stage
/// model's activation arena), not owned: where it is and how many elements.
struct ArenaFloats {
  float* ptr = nullptr;
  size_t n = 0;
  float* data() const { return ptr; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  float& operator[](size_t i) const { return ptr[i]; }
  float* begin() const { return ptr; }
  float* end() const { return ptr + n; }
};

struct MoeLayersCpu::State {
  cpu::MoeRouting routing;
  std::vector<int64_t> send_counts;     // [ep, L] elements of this rank's copies per expert
  std::vector<int64_t> recv_counts;     // [ep, L] elements arriving per (source, local expert)
  std::vector<int64_t> scratch_counts;  // [ep, L] the counts the other exchanges return
  std::vector<int64_t> local_rows;      // [L] own rows per local expert (all EP sources)
  std::vector<int64_t> gemm_rows;       // [L] rows each local expert computes on
  // Expert tensor parallelism: [etp, L] elements per (TP member, local expert).
  std::vector<int64_t> tp_send_counts;     // own rows, to every member
  std::vector<int64_t> tp_recv_counts;     // every member's own rows, from the gather
  std::vector<int64_t> tp_scratch_counts;  // what the other TP exchanges return
  ArenaFloats permuted;                    // [N k, h] rank layout
  ArenaFloats received;                    // [ep N k, h] EP source-major
  ArenaFloats expert_in;                   // [ep N k, h] own rows, expert-major
  ArenaFloats tp_send, tp_recv;            // [etp ep N k, h] forward TP exchanges
  ArenaFloats gathered;                    // [etp ep N k, h] gathered rows, expert-major
  ArenaFloats fc1_out, act;                // [etp ep N k, 2F], [etp ep N k, F]
  ArenaFloats expert_out;                  // [etp ep N k, h] expert-major (partial with etp)
  ArenaFloats expert_own;                  // [ep N k, h] own rows summed over TP, expert-major
  ArenaFloats expert_out_src;              // [ep N k, h] EP source-major
  ArenaFloats combined;                    // [N k, h] rank layout
  ArenaFloats d_combined, dgate;           // [N k, h], [N k]
  ArenaFloats d_expert_out_src;            // [ep N k, h]
  ArenaFloats d_expert_out;                // [ep N k, h] own rows, expert-major
  ArenaFloats d_tp_send, d_tp_recv;        // [etp ep N k, h] backward TP exchanges
  ArenaFloats d_gathered;                  // [etp ep N k, h] expert-major
  ArenaFloats d_act, d_fc1;                // [etp ep N k, F], [etp ep N k, 2F]
  ArenaFloats d_expert_in;                 // [etp ep N k, h] expert-major (partial with etp)
  ArenaFloats d_expert_own;                // [ep N k, h] summed over TP, expert-major
  ArenaFloats d_expert_in_src;             // [ep N k, h] EP source-major
  ArenaFloats d_permuted;                  // [N k, h] rank layout
  ArenaFloats d_from_permute, d_from_router, dz;  // [N, h], [N, h], [N, E]
  // The shared expert: fc1 output [N, 2Fs], activation [N, Fs], output before the gate
  // [N, h], gate logit and gate per token [N]; backward: d of each, d(logit) [N], the
  // gate-scaled output gradient (dgrad's [N, h] and wgrad's own copy [N, h]), and the two
  // input gradients [N, h] (through fc1, through the gate).
  // With tp > 1 fc1, the activation and their gradients hold the TP group's T = tp N rows
  // (Fs/tp wide), and so do the gathered input, the partial output, the gathered d out and
  // fc1's partial input gradient (s_*_all, [T, h]; empty with tp = 1).
  ArenaFloats s_fc1, s_act, s_out, s_logit, s_gate;
  ArenaFloats s_d_act, s_d_fc1, s_d_logit, s_d_out, s_d_out_w, d_from_shared, d_from_gate;
  ArenaFloats s_x_all, s_out_all, s_d_out_all, s_d_x_all;
  // Where each stage reads (see the file comment for the aliasing without EP or ETP).
  float* own_in = nullptr;          // own rows, expert-major: expert_in or permuted
  float* experts_read = nullptr;    // gathered, or own_in
  float* own_out = nullptr;         // the experts' output of the own rows, expert-major
  float* unpermute_read = nullptr;  // combined, or own_out
  float* own_grad = nullptr;        // d of the own rows' output: d_expert_out or d_combined
  float* experts_grad = nullptr;    // d_gathered, or own_grad
  float* own_in_grad = nullptr;     // d of the own rows' input: d_expert_own or d_expert_in
  float* permute_grad = nullptr;    // d_permuted, or own_in_grad
};

namespace moe_detail {

inline size_t to_size(int64_t n) { return static_cast<size_t>(n); }

/// Copies rows between the source-major and expert-major orders: rows[src * L + e] rows of
/// (source src, local expert e), h elements each. `to_expert`: source-major ->
/// expert-major, else back.
void regroup(int64_t sources, int64_t local, const std::vector<int64_t>& rows, int64_t h,
             const float* from, float* to, bool to_expert);

/// counts / h, element by element (an all-to-all's element counts as rows).
std::vector<int64_t> rows_of(const std::vector<int64_t>& counts, int64_t h);

}  // namespace moe_detail
}  // namespace dhelix::rt
