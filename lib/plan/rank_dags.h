#pragma once
// What the lowering (lib/plan/rank_program.cc) reads of one rank's DAGs, and nothing else:
// per op its id, kind, stream, process group, communication bytes, part and whether it is a
// weight gradient (the W of a split backward); per DAG its predecessor lists and topological
// order; the outputs of the layer, the embedding and the head; the orders of the stage
// extras. Shapes, FLOPs and signatures, which differ between
// ranks of a stage (the last tensor-parallel rank may hold fewer vocabulary entries), are
// left out, so that two ranks whose RankDags are equal lower to the same program (see
// RankLoweringInput in lib/plan/rank_program.h). Internal to lib/plan/.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// One op as the lowering reads it.
/// FSDP's parameter all-gathers (lib/dag_builder_fsdp.cc: all-gathers over the dp group):
/// the layer ops that read only the rank's parameter shard, nothing the layer's input or
/// its output's gradient produced. Lowering (rank_program.cc) gives them no pipeline
/// dependency and treats their successors as the layer's first ops.
bool reads_only_parameters(const Op& op);

struct LoweredOp {
  std::string id;
  OpKind kind = OpKind::kGemm;
  StreamClass stream = StreamClass::kCompute;
  ParallelDim group = ParallelDim::kTp;  ///< communication ops only
  int64_t comm_bytes = 0;                ///< communication ops only
  OpPart part = OpPart::kLayer;
  /// A weight-gradient GEMM (backward_work == kWeightGradient): the W of a split backward.
  bool weight_gradient = false;
  /// FSDP's parameter all-gather (reads_only_parameters, lib/op_catalogue.h).
  bool parameters_only = false;
  bool operator==(const LoweredOp&) const = default;
};

/// One DAG as lowering reads it, many times per micro-batch and layer: its ops, predecessor
/// lists and topological order, and where its ops start in the table of producers (and in
/// the program's op ids).
struct DagView {
  std::vector<LoweredOp> ops;
  int64_t slot_offset = 0;
  std::vector<std::vector<int64_t>> predecessors;
  std::vector<int64_t> order;

  DagView() = default;
  DagView(const LayerDag& dag, int64_t offset);
  int64_t size() const { return static_cast<int64_t>(ops.size()); }
  /// The index of the op named `id`; nullopt when there is none.
  std::optional<int64_t> find(std::string_view id) const;
  /// The ops of `part`, in topological order.
  std::vector<int64_t> ordered(OpPart part) const;
  bool operator==(const DagView&) const = default;
};

/// The rank's four DAGs (layer and stage extras, forward and backward), read once.
struct RankDags {
  DagView layer_forward, layer_backward, extras_forward, extras_backward;
  int64_t layer_forward_output = -1, layer_backward_output = -1;
  int64_t embedding_forward_output = -1, head_forward_output = -1, head_backward_output = -1;
  std::vector<int64_t> embedding_forward_order, embedding_backward_order;
  std::vector<int64_t> head_forward_order, head_backward_order;
  int64_t slots = 0;  ///< ops of all four DAGs: the producer table's row width
  /// The op ids by slot, which instructions' `op` views point into (derived from the views).
  std::shared_ptr<std::vector<std::string>> op_ids;

  /// Builds the DAGs of world rank `rank` on `stage` (lib/dag_builder.h; throws as it does).
  RankDags(const JobSpec& job, int64_t rank, const PlanStage& stage);

  std::string_view id(const DagView& view, int64_t index) const {
    return (*op_ids)[static_cast<size_t>(view.slot_offset + index)];
  }
  /// Equal when every field but op_ids (which the views determine) is.
  bool operator==(const RankDags& other) const;
};

}  // namespace dhelix
