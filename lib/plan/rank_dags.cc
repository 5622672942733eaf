#include "lib/plan/rank_dags.h"

#include <algorithm>
#include <tuple>

#include "lib/dag_builder.h"
#include "lib/error.h"

namespace dhelix {
namespace {

// The op of a DAG part whose result leaves it: the one op that is not a movable sink (a
// weight gradient nothing waits for) and that only movable sinks follow (FSDP's gradient
// reduce-scatter follows the last norm backward, which produces the layer's output
// gradient). -1 for an empty part.
int64_t output_op(const LayerDag& dag, OpPart part) {
  const auto only_movable_sinks_follow = [&dag](int64_t i) {
    const std::vector<int64_t> next = dag.successors(i);
    return std::all_of(next.begin(), next.end(),
                       [&dag](int64_t s) { return dag.op(s).movable_sink; });
  };
  int64_t found = -1;
  for (int64_t i = 0; i < dag.size(); ++i) {
    const Op& op = dag.op(i);
    if (op.part != part || op.movable_sink || !only_movable_sinks_follow(i)) continue;
    DHELIX_CHECK(found < 0);  // the DAG builder gives every part one output
    found = i;
  }
  return found;
}

LoweredOp lowered_op(const Op& op) {
  LoweredOp out;
  out.id = op.id;
  out.kind = op.kind;
  out.stream = op.stream;
  out.part = op.part;
  out.weight_gradient = backward_work(op) == BackwardWork::kWeightGradient;
  out.parameters_only = reads_only_parameters(op);
  if (is_communication(op.kind)) {  // the only ops whose group and bytes lowering reads
    out.group = op.group;
    out.comm_bytes = op.comm_bytes;
  }
  return out;
}

}  // namespace

bool reads_only_parameters(const Op& op) {
  return op.kind == OpKind::kAllGather && op.group == ParallelDim::kDp && op.part == OpPart::kLayer;
}

DagView::DagView(const LayerDag& dag, int64_t offset) : slot_offset(offset) {
  for (int64_t i = 0; i < dag.size(); ++i) {
    ops.push_back(lowered_op(dag.op(i)));
    predecessors.push_back(dag.predecessors(i));
  }
  order = dag.topological_order();
}

std::optional<int64_t> DagView::find(std::string_view id) const {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].id == id) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

std::vector<int64_t> DagView::ordered(OpPart part) const {
  std::vector<int64_t> out;
  for (int64_t i : order) {
    if (ops[static_cast<size_t>(i)].part == part) out.push_back(i);
  }
  return out;
}

RankDags::RankDags(const JobSpec& job, int64_t rank, const PlanStage& stage) {
  const LayerDags layer =
      with_recompute(build_layer_dags(job, rank), job.parallel.recompute.granularity);
  const LayerDags extras = build_stage_extras(job, rank, stage.embedding, stage.head_loss);
  layer_forward = DagView(layer.forward, 0);
  layer_backward = DagView(layer.backward, layer.forward.size());
  extras_forward = DagView(extras.forward, layer_backward.slot_offset + layer.backward.size());
  extras_backward = DagView(extras.backward, extras_forward.slot_offset + extras.forward.size());
  slots = extras_backward.slot_offset + extras.backward.size();
  op_ids = std::make_shared<std::vector<std::string>>();
  op_ids->reserve(static_cast<size_t>(slots));
  for (const DagView* view : {&layer_forward, &layer_backward, &extras_forward, &extras_backward}) {
    for (const LoweredOp& op : view->ops) op_ids->push_back(op.id);
  }
  layer_forward_output = output_op(layer.forward, OpPart::kLayer);
  layer_backward_output = output_op(layer.backward, OpPart::kLayer);
  embedding_forward_output = output_op(extras.forward, OpPart::kEmbedding);
  head_forward_output = output_op(extras.forward, OpPart::kHead);
  head_backward_output = output_op(extras.backward, OpPart::kHead);
  embedding_forward_order = extras_forward.ordered(OpPart::kEmbedding);
  embedding_backward_order = extras_backward.ordered(OpPart::kEmbedding);
  head_forward_order = extras_forward.ordered(OpPart::kHead);
  head_backward_order = extras_backward.ordered(OpPart::kHead);
}

namespace {
auto fields(const RankDags& d) {
  return std::tie(d.layer_forward, d.layer_backward, d.extras_forward, d.extras_backward,
                  d.layer_forward_output, d.layer_backward_output, d.embedding_forward_output,
                  d.head_forward_output, d.head_backward_output, d.embedding_forward_order,
                  d.embedding_backward_order, d.head_forward_order, d.head_backward_order, d.slots);
}
}  // namespace

bool RankDags::operator==(const RankDags& other) const { return fields(*this) == fields(other); }

}  // namespace dhelix
