#pragma once
// Which ops write which parameters' gradients: the one table of it, read by the
// overlapped data-parallel reduction (runtime/train/gradient_reduction.h) to know when a
// parameter's gradient is final (after the last instruction of the rank program that
// writes it), so that its bucket can be summed while the backward goes on.
//
// The table, by layer DAG op id (lib/dag_builder*.cc) and the parameter names of
// BasicStageModel::parameters() ("layers.<l>.<part>" for a layer's, bare for the extras):
//
//   bwd.ln_attn            layers.<l>.ln_attn         bwd.ln_mlp          layers.<l>.ln_mlp
//   bwd.qkv_wgrad          layers.<l>.w_qkv           bwd.proj_wgrad      layers.<l>.w_proj
//   bwd.fc1_wgrad          layers.<l>.w_fc1           bwd.fc2_wgrad       layers.<l>.w_fc2
//   bwd.router_wgrad       layers.<l>.router          (MoE; moe_layers_cpu.cc)
//   bwd.grouped_fc1_wgrad  layers.<l>.experts_fc1     bwd.grouped_fc2_wgrad  .experts_fc2
//   bwd.shared_fc2_dgrad   layers.<l>.shared_gate     (the gate's gradient is made with the
//                                                      shared expert's input gradient)
//   bwd.shared_fc1_wgrad   layers.<l>.shared_fc1      bwd.shared_fc2_wgrad  .shared_fc2
//   bwd.embedding          embedding                  bwd.final_norm      final_norm
//   bwd.head_wgrad         head
//
// Every other op (forward ops, recompute's bwd.recompute.<op>, dgrads, communication) writes
// no parameter gradient. A test runs whole iterations of dense, MoE (with a shared expert)
// and CP plans and checks, instruction by instruction, that exactly the parameters this
// table names change their gradients (tests/runtime/gradient_reduction_test.cc): an op that
// starts writing a gradient it does not list here makes that test fail.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dhelix::rt {

/// The names of the parameters whose gradients op `op` (a layer DAG op id, without any
/// "L<k>." prefix) of layer `layer` (-1 for the embedding, head and loss) accumulates
/// into; empty for an op that writes none.
std::vector<std::string> gradients_written_by(std::string_view op, int64_t layer);

}  // namespace dhelix::rt
