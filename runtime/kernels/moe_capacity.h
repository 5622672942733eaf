#pragma once
// Expert capacity, token dropping and the load-balancing loss of a Mixtral-style MoE layer,
// as Megatron-Core computes them on one rank's T tokens before the dispatch (its
// topk_softmax_with_capacity and switch_load_balancing_loss_func):
//
//   capacity  C = ceil(cf * T * k / E)     (cf = the model's moe.capacity_factor; 0: none)
//   dropping    each expert keeps the C assignments of highest gate weight g (ties: the
//               lower token index), Megatron's default moe_token_drop_policy "probs"; a
//               dropped assignment's gate weight is 0 in the combine (no renormalisation)
//   aux loss    L_aux = alpha * E / (T^2 * k) * sum_e n_e * sum_t p_te
//               n_e = assignments routed to expert e before dropping, p = full softmax
//   dL_aux/dp_te = alpha * E / (T^2 * k) * n_e          (n_e is a count: no gradient)
//
// Worked example: T = 4 tokens, k = 2, E = 4, cf = 1: C = ceil(4 * 2 / 4) = 2. If tokens
// 0, 1, 2 all route to expert 0 with gate weights 0.6, 0.7, 0.6, expert 0 keeps tokens 1
// (0.7) and 0 (0.6, lower index than token 2) and drops token 2's assignment.
//
// The CPU runs drop_over_capacity (a sort per expert); the CUDA backend decides each
// assignment on its own thread with keeps_assignment (capacity_priority, which gives every
// assignment the position that sort gives it, where its expert is over capacity), so both
// drop exactly the same assignments. Every sum has a fixed order.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Assignments one expert accepts from `tokens` tokens routed top-`k` over `experts`
/// experts: ceil(cf * tokens * k / experts), or tokens (no limit) when cf is 0. Computed as
/// the planner does (lib/dag_builder_moe.cc), so plan and run agree on the capacity.
inline int64_t expert_capacity(int64_t tokens, int64_t k, int64_t experts, double cf) {
  if (cf <= 0.0) return tokens;
  const double mean_share = static_cast<double>(tokens * k) / static_cast<double>(experts);
  return std::min(tokens, static_cast<int64_t>(std::ceil(cf * mean_share - 1e-9)));
}

/// Marks kept[t * k + j] (1 kept, 0 dropped) for the assignments chosen[tokens * k] with
/// gate weights gate[tokens * k]: each expert keeps its `capacity` assignments of highest
/// weight, ties by lower token index. Returns the number dropped.
inline int64_t drop_over_capacity(int64_t tokens, int64_t k, int64_t experts, int64_t capacity,
                                  const int32_t* chosen, const float* gate, uint8_t* kept) {
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts));
  for (int64_t a = 0; a < tokens * k; ++a) routed[static_cast<size_t>(chosen[a])].push_back(a);
  int64_t dropped = 0;
  for (std::vector<int64_t>& list : routed) {
    // Assignment a belongs to token a / k: ascending a is ascending token index.
    std::stable_sort(list.begin(), list.end(),
                     [gate](int64_t x, int64_t y) { return gate[x] > gate[y]; });
    for (size_t i = 0; i < list.size(); ++i) {
      const bool keep = static_cast<int64_t>(i) < capacity;
      kept[list[i]] = keep ? 1 : 0;
      dropped += keep ? 0 : 1;
    }
  }
  return dropped;
}

/// The position drop_over_capacity's stable sort gives assignment a among the assignments
/// routed to its expert: those of higher gate weight, and those of equal weight and lower
/// index, come first. a is kept iff the result is below the capacity. O(assignments) per
/// call, no allocation: one GPU thread per assignment decides it alone.
DHELIX_HOST_DEVICE inline int64_t capacity_priority(int64_t assignments, const int32_t* chosen,
                                                    const float* gate, int64_t a) {
  int64_t before = 0;
  for (int64_t b = 0; b < assignments; ++b) {
    if (b == a || chosen[b] != chosen[a]) continue;
    if (gate[b] > gate[a] || (b < a && !(gate[b] < gate[a]))) ++before;
  }
  return before;
}

/// Whether assignment a fits its expert's capacity, given routed[e] (the assignments routed
/// to each expert before dropping): always when its expert received no more than the
/// capacity (then every priority is below it), else capacity_priority's test. The same
/// decision as capacity_priority alone, in O(1) for every expert within its capacity
/// (every expert under dropless routing, where the capacity is the token count).
DHELIX_HOST_DEVICE inline bool keeps_assignment(int64_t assignments, const int32_t* chosen,
                                                const float* gate, const int64_t* routed,
                                                int64_t capacity, int64_t a) {
  if (routed[chosen[a]] <= capacity) return true;
  return capacity_priority(assignments, chosen, gate, a) < capacity;
}

/// n_e: assignments routed to each expert (before dropping) into counts[experts].
DHELIX_HOST_DEVICE inline void routed_counts(int64_t tokens, int64_t k, int64_t experts,
                                             const int32_t* chosen, int64_t* counts) {
  for (int64_t e = 0; e < experts; ++e) counts[e] = 0;
  for (int64_t a = 0; a < tokens * k; ++a) ++counts[chosen[a]];
}

/// alpha * E / (T^2 * k): the factor of the loss and of its gradient.
DHELIX_HOST_DEVICE inline double load_balancing_scale(int64_t tokens, int64_t k, int64_t experts,
                                                      double alpha) {
  const double t = static_cast<double>(tokens);
  return alpha * static_cast<double>(experts) / (t * t * static_cast<double>(k));
}

/// L_aux from the full softmax p[tokens, experts] and counts[experts]; sums token-major.
DHELIX_HOST_DEVICE inline float load_balancing_loss(int64_t tokens, int64_t k, int64_t experts,
                                                    double alpha, const float* p,
                                                    const int64_t* counts) {
  double sum = 0.0;
  for (int64_t e = 0; e < experts; ++e) {
    double column = 0.0;
    for (int64_t t = 0; t < tokens; ++t) column += p[t * experts + e];
    sum += static_cast<double>(counts[e]) * column;
  }
  return static_cast<float>(load_balancing_scale(tokens, k, experts, alpha) * sum);
}

/// dL_aux/dp_e for every token (the same row for all), scaled by `dloss` (the weight the
/// trainer gives the loss): dp[experts].
DHELIX_HOST_DEVICE inline void load_balancing_gradient(int64_t tokens, int64_t k, int64_t experts,
                                                       double alpha, const int64_t* counts,
                                                       float dloss, float* dp) {
  const double scale = load_balancing_scale(tokens, k, experts, alpha) * dloss;
  for (int64_t e = 0; e < experts; ++e) dp[e] = static_cast<float>(scale * counts[e]);
}

/// One element of load_balancing_gradient, dp_e from n_e (the same bits): what a lane of
/// the warp-per-token router backward computes instead of holding the row of E values.
DHELIX_HOST_DEVICE inline float load_balancing_gradient_at(int64_t tokens, int64_t k,
                                                           int64_t experts, double alpha,
                                                           int64_t count, float dloss) {
  const double scale = load_balancing_scale(tokens, k, experts, alpha) * dloss;
  return static_cast<float>(scale * count);
}

}  // namespace dhelix::kernels
