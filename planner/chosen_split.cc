#include "planner/chosen_split.h"

#include <fmt/format.h>

#include "lib/dag_builder.h"
#include "lib/error.h"

namespace dhelix {
namespace {

double dags_us(const LayerDags& dags, const std::function<double(const Op&)>& solo_us) {
  double total = 0;
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) total += solo_us(dag->op(i));
  }
  return total;
}

}  // namespace

SplitTimes split_times(const JobSpec& job, const std::function<double(const Op&)>& solo_us) {
  // Rank 0 is on pipeline stage 0 under every rank order: its coordinates are all 0.
  const int64_t rank = 0;
  LayerDags layer = build_layer_dags(job, rank);
  if (job.parallel.recompute.enabled()) {
    layer = with_recompute(std::move(layer), job.parallel.recompute.granularity);
  }
  return {.layer_us = dags_us(layer, solo_us),
          .embedding_us = dags_us(build_stage_extras(job, rank, true, false), solo_us),
          .head_loss_us = dags_us(build_stage_extras(job, rank, false, true), solo_us)};
}

JobSpec with_planned_split(const JobSpec& job, const std::function<double(const Op&)>& solo_us,
                           std::string* note) {
  if (note != nullptr) note->clear();
  if (!planner_chooses_split(job.model.num_layers, job.parallel)) return job;
  const SplitTimes times = split_times(job, solo_us);
  std::string why;
  const std::optional<ChosenSplit> chosen =
      choose_stage_split(job.model.num_layers, job.parallel.pp, times, why);
  if (!chosen)
    throw Error(ErrorCode::kInvalidInput, fmt::format("pp = {}: {}", job.parallel.pp, why));
  JobSpec out = job;
  out.parallel.first_stage_layers = chosen->ends.first;
  out.parallel.last_stage_layers = chosen->ends.last;
  if (note != nullptr) {
    *note = fmt::format(
        "{} layers do not fold into 2·pp = {} equal chunks: the planner chose uneven stages, "
        "decoder_first_pipeline_num_layers = {}, decoder_last_pipeline_num_layers = {} ({} "
        "layers on every middle stage; a layer {:.0f} us, the embedding {:.0f} us, head and "
        "loss {:.0f} us forward and backward; docs/pipeline.md, \"Uneven stages\")",
        job.model.num_layers, 2 * job.parallel.pp,
        chosen->ends.first > 0 ? std::to_string(chosen->ends.first) : "unset",
        chosen->ends.last > 0 ? std::to_string(chosen->ends.last) : "unset", chosen->middle_layers,
        times.layer_us, times.embedding_us, times.head_loss_us);
  }
  return out;
}

}  // namespace dhelix
