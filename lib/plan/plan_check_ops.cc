// Check 11 (lib/plan/plan_check.h): the op records of every pairing against the layer DAGs
// rebuilt from the plan's own job. The runtime and dhelix-profile --from-trace key times by
// an op's signature, and dhelix-diff reports per kind: a record whose signature, kind,
// stream or group was edited (or written for another shape) would be believed. Each
// pairing is compared with the DAGs of the first stage that uses it (stages share a pairing
// only when their DAGs' signatures are equal, planner/plan_builder.cc), at the stage's
// shape rank. Cost: one DAG build per pairing.

#include <fmt/format.h>

#include <set>

#include "lib/dag_builder.h"
#include "lib/plan/plan_check.h"

namespace dhelix {
namespace {

std::string group_text(const std::optional<ParallelDim>& group) {
  return group ? fmt::format("\"{}\"", parallel_dim_name(*group)) : std::string("\"\"");
}

void check_records(const std::vector<PlanOp>& records, const LayerDag& dag,
                   const std::string& pointer, const std::string& plan_file,
                   ProblemList& problems) {
  for (size_t i = 0; i < records.size(); ++i) {
    const PlanOp& record = records[i];
    const std::string at = fmt::format("{}/{}/", pointer, i);
    const std::optional<int64_t> index = dag.find(record.id);
    if (!index) {
      problems.add(plan_file, at + "id", fmt::format("\"{}\"", record.id),
                   "names no op of the layer DAG rebuilt from the plan's own /job");
      continue;
    }
    const Op& op = dag.op(*index);
    const std::string rebuilt = "of the layer DAG rebuilt from the plan's own /job";
    if (record.signature != op.signature()) {
      problems.add(plan_file, at + "signature", fmt::format("\"{}\"", record.signature),
                   fmt::format("differs from \"{}\", the signature {}", op.signature(), rebuilt));
    }
    if (record.kind != op.kind) {
      problems.add(plan_file, at + "kind", fmt::format("\"{}\"", op_kind_name(record.kind)),
                   fmt::format("differs from \"{}\" {}", op_kind_name(op.kind), rebuilt));
    }
    if (record.stream != op.stream) {
      problems.add(plan_file, at + "stream",
                   fmt::format("\"{}\"", stream_class_name(record.stream)),
                   fmt::format("differs from \"{}\" {}", stream_class_name(op.stream), rebuilt));
    }
    const std::optional<ParallelDim> group =
        is_communication(op.kind) ? std::optional(op.group) : std::nullopt;
    if (record.group != group) {
      problems.add(plan_file, at + "group", group_text(record.group),
                   fmt::format("differs from {} {}", group_text(group), rebuilt));
    }
  }
}

}  // namespace

void check_op_records(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                      ProblemList& problems) {
  std::set<int64_t> checked;
  const int64_t world = job.parallel.world_size();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& stage = plan.stages[s];
    if (stage.shape_rank >= world) {
      problems.add(plan_file, fmt::format("/stages/{}/shape_rank", s),
                   std::to_string(stage.shape_rank),
                   fmt::format("is not one of the job's {} ranks", world));
      continue;
    }
    if (stage.pairing < 0 || stage.pairing >= static_cast<int64_t>(plan.pairings.size())) continue;
    if (!checked.insert(stage.pairing).second) continue;
    const PlanPairing& pairing = plan.pairings[static_cast<size_t>(stage.pairing)];
    // As the lowering builds them (lib/plan/rank_dags.cc): with the recomputed forward ops.
    const LayerDags dags =
        with_recompute(build_layer_dags(job, stage.shape_rank), job.parallel.recompute.granularity);
    const std::string pointer = fmt::format("/pairings/{}", stage.pairing);
    check_records(pairing.forward_ops, dags.forward, pointer + "/forward_ops", plan_file, problems);
    check_records(pairing.backward_ops, dags.backward, pointer + "/backward_ops", plan_file,
                  problems);
  }
}

}  // namespace dhelix
