#include "profiler/model_backend.h"

#include <unordered_set>

#include "lib/cluster_reader.h"
#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "lib/job_reader.h"
#include "lib/placement.h"
#include "profiler/interference.h"

namespace dhelix {
namespace {

void add_dag_ops(const LayerDag& dag, std::unordered_set<std::string>& seen, std::vector<Op>& ops) {
  for (int64_t i = 0; i < dag.size(); ++i) {
    const Op& op = dag.op(i);
    if (seen.insert(op.signature()).second) ops.push_back(op);
  }
}

// Whether the planner may co-run a and b (see the file comment of model_backend.h).
bool is_profiled_pair(const Op& a, const Op& b) {
  const bool comm_a = is_communication(a.kind);
  const bool comm_b = is_communication(b.kind);
  return comm_a || comm_b;  // compute x comm, and comm x comm of either class combination
}

}  // namespace

ProfiledOp profiled_op(const Op& op, const TimeStats& time_us, int64_t samples) {
  return {.signature = op.signature(),
          .kind = op.kind,
          .stream = op.stream,
          .example_op_id = op.id,
          .time_us = time_us,
          .samples = samples};
}

ProfileSpace collect_profile_space(const JobSpec& job) {
  ProfileSpace space;
  std::unordered_set<std::string> seen;
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  for (int64_t stage = 0; stage < job.parallel.pp; ++stage) {
    const int64_t rank = placement.rank_of({.pp = stage});
    const LayerDags layer = build_layer_dags(job, rank);
    add_dag_ops(layer.forward, seen, space.ops);
    add_dag_ops(layer.backward, seen, space.ops);
    // Both flags: under folding one stage may hold embedding and head; their shapes do not
    // depend on the stage, so this covers every placement the planner may choose.
    const LayerDags extras = build_stage_extras(job, rank, true, true);
    add_dag_ops(extras.forward, seen, space.ops);
    add_dag_ops(extras.backward, seen, space.ops);
  }
  // The intra-batch baseline's chunked ops (GEMM chunks, ring steps) after all the others,
  // so that the ops of the normal DAGs keep their places.
  for (int64_t stage = 0; stage < job.parallel.pp; ++stage) {
    const LayerDags intra = build_intra_batch_layer_dags(job, placement.rank_of({.pp = stage}));
    add_dag_ops(intra.forward, seen, space.ops);
    add_dag_ops(intra.backward, seen, space.ops);
  }
  const int64_t n = static_cast<int64_t>(space.ops.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i; j < n; ++j) {
      if (is_profiled_pair(space.ops[i], space.ops[j])) space.pairs.emplace_back(i, j);
    }
  }
  return space;
}

Profile make_model_profile(const JobSpec& job, const OrderedJson& meta,
                           const ProgressCallback& progress) {
  const ProfileSpace space = collect_profile_space(job);
  Profile profile;
  profile.meta = meta;
  profile.backend = ProfileBackend::kModel;
  profile.cluster = cluster_to_json(job.cluster);
  profile.model_name = job.model.name;
  profile.parallel = parallel_to_json(job.parallel);
  const int64_t total = static_cast<int64_t>(space.ops.size() + space.pairs.size());
  int64_t done = 0;
  std::vector<double> times;
  for (const Op& op : space.ops) {
    times.push_back(quantize_profile_value(op_time_us(job.cluster, op)));
    profile.add_op(profiled_op(op, TimeStats::exactly(times.back()), 1));
    if (progress) progress(++done, total);
  }
  for (const auto& [i, j] : space.pairs) {
    const Op& a = space.ops[static_cast<size_t>(i)];
    const Op& b = space.ops[static_cast<size_t>(j)];
    const CoRun run =
        co_run_from_rates(times[static_cast<size_t>(i)], times[static_cast<size_t>(j)],
                          co_run_rates(job.cluster, a, b));
    profile.add_pair({.a = a.signature(),
                      .b = b.signature(),
                      .finish_a_us = quantize_profile_value(run.finish_a_us),
                      .finish_b_us = quantize_profile_value(run.finish_b_us),
                      .makespan_us = quantize_profile_value(run.makespan_us),
                      .oef = quantize_profile_value(run.oef)});
    if (progress) progress(++done, total);
  }
  return profile;
}

std::vector<std::string> list_profile_space(const JobSpec& job) {
  const ProfileSpace space = collect_profile_space(job);
  std::vector<std::string> lines;
  for (const Op& op : space.ops) {
    lines.push_back("op " + std::string(stream_class_name(op.stream)) + " " + op.signature() +
                    " (" + op.id + ")");
  }
  for (const auto& [i, j] : space.pairs) {
    lines.push_back("pair " + space.ops[static_cast<size_t>(i)].signature() + " x " +
                    space.ops[static_cast<size_t>(j)].signature());
  }
  return lines;
}

}  // namespace dhelix
