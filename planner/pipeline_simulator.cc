#include "planner/pipeline_simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "lib/error.h"

namespace dhelix {

CommBreakdown& CommBreakdown::operator+=(const CommBreakdown& other) {
  for (size_t i = 0; i < by_dim.size(); ++i) {
    by_dim[i].hidden_us += other.by_dim[i].hidden_us;
    by_dim[i].exposed_us += other.by_dim[i].exposed_us;
  }
  return *this;
}

CommBreakdown CommBreakdown::scaled(double factor) const {
  CommBreakdown result = *this;
  for (CommTime& time : result.by_dim) {
    time.hidden_us *= factor;
    time.exposed_us *= factor;
  }
  return result;
}

double CommBreakdown::total_hidden_us() const {
  double total = 0;
  for (const CommTime& time : by_dim) total += time.hidden_us;
  return total;
}

double CommBreakdown::total_exposed_us() const {
  double total = 0;
  for (const CommTime& time : by_dim) total += time.exposed_us;
  return total;
}

StageCosts chunk_costs(const LayerCosts& layer, int64_t layers_per_chunk, StageCosts extras) {
  const auto n = static_cast<double>(layers_per_chunk);
  extras.forward_chunk_us = layer.forward_us * n;
  extras.backward_chunk_us = layer.backward_us * n;
  extras.backward_weight_chunk_us = std::min(layer.backward_weight_us, layer.backward_us) * n;
  extras.si_block_us = layer.si_pair_us * n;
  extras.forward_comm = layer.forward_comm.scaled(n);
  extras.backward_comm = layer.backward_comm.scaled(n);
  extras.si_block_comm = layer.si_pair_comm.scaled(n);
  extras.layers_per_chunk = layers_per_chunk;
  extras.activation_bytes_per_layer = layer.activation_bytes;
  return extras;
}

int64_t PipelineSimulation::peak_activation_bytes() const {
  int64_t peak = 0;
  for (const StageSimulation& stage : stages) peak = std::max(peak, stage.peak_activation_bytes);
  return peak;
}

namespace {

constexpr double kNotDone = -1.0;

// End times of every work item, indexed by (stage, pass, chunk side, model chunk,
// micro-batch).
class EndTimes {
 public:
  EndTimes(int64_t pp, int64_t m, int64_t model_chunks)
      : m_(m),
        chunks_(model_chunks),
        ends_(static_cast<size_t>(pp * 4 * 3 * model_chunks * m), kNotDone) {}
  double& at(const WorkItem& item) {
    const int64_t slot = static_cast<int64_t>(item.chunk) * chunks_ + item.model_chunk;
    const int64_t index =
        ((item.stage * 4 + static_cast<int64_t>(item.pass)) * 3 * chunks_ + slot) * m_ +
        item.micro_batch;
    return ends_.at(static_cast<size_t>(index));
  }

 private:
  int64_t m_;
  int64_t chunks_;
  std::vector<double> ends_;
};

void check_costs(const PipelineSchedule& schedule, const std::vector<StageCosts>& costs) {
  if (static_cast<int64_t>(costs.size()) != schedule.pp) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("pipeline simulation: {} stage costs given for pp = {}", costs.size(),
                            schedule.pp));
  }
  for (size_t p = 0; p < costs.size(); ++p) {
    const StageCosts& c = costs[p];
    const double times[] = {
        c.forward_chunk_us,     c.backward_chunk_us,     c.backward_weight_chunk_us,
        c.si_block_us,          c.embedding_forward_us,  c.embedding_backward_us,
        c.head_loss_forward_us, c.head_loss_backward_us, c.p2p_us,
        c.dp_reduce_us,         c.optimizer_us};
    for (double t : times) {
      if (!(std::isfinite(t) && t >= 0)) {
        throw Error(ErrorCode::kInvalidInput,
                    fmt::format("pipeline simulation: stage {}: a task time is {} us; times "
                                "must be finite and non-negative",
                                p, t));
      }
    }
    if (c.backward_weight_chunk_us > c.backward_chunk_us) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("pipeline simulation: stage {}: the weight-gradient part {} us "
                              "exceeds the whole backward {} us",
                              p, c.backward_weight_chunk_us, c.backward_chunk_us));
    }
    if (c.layers_per_chunk < 1 || c.up_layers < 0) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("pipeline simulation: stage {}: layers_per_chunk = {} must be "
                              ">= 1 and up_layers = {} >= 0",
                              p, c.layers_per_chunk, c.up_layers));
    }
    if (!c.model_chunk_layers.empty() &&
        static_cast<int64_t>(c.model_chunk_layers.size()) != schedule.model_chunks) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("pipeline simulation: stage {}: {} model chunk layer counts for "
                              "{} model chunks",
                              p, c.model_chunk_layers.size(), schedule.model_chunks));
    }
  }
}

// A chunk's time (and communication) for `layers` layers from the figures of a chunk of
// layers_per_chunk layers.
double scaled_us(double chunk_us, const StageCosts& c, int64_t layers) {
  return chunk_us * static_cast<double>(layers) / static_cast<double>(c.layers_per_chunk);
}

CommBreakdown scaled_comm(const CommBreakdown& comm, const StageCosts& c, int64_t layers) {
  if (layers == c.layers_per_chunk) return comm;
  return comm.scaled(static_cast<double>(layers) / static_cast<double>(c.layers_per_chunk));
}

// An SI block of a forward of nf layers and a backward of nb layers: min(nf, nb) layer pairs
// co-run, the rest run alone (the file comment).
double si_block_time_us(const StageCosts& c, int64_t nf, int64_t nb, CommBreakdown& comm) {
  const int64_t pairs = std::min(nf, nb);
  comm += scaled_comm(c.si_block_comm, c, pairs);
  comm += scaled_comm(c.forward_comm, c, nf - pairs);
  comm += scaled_comm(c.backward_comm, c, nb - pairs);
  return scaled_us(c.si_block_us, c, pairs) + scaled_us(c.forward_chunk_us, c, nf - pairs) +
         scaled_us(c.backward_chunk_us, c, nb - pairs);
}

// Compute time of a task on `stage`, and the TP/CP/EP communication it carries.
double task_time_us(const PipelineSchedule& schedule, const StageCosts& c, int64_t stage,
                    const PipelineTask& task, CommBreakdown& comm) {
  const bool embedding_stage = stage == schedule.embedding_stage;
  // The embedding's backward goes with the input-gradient half (or the whole backward).
  const bool forward_embedding = embedding_stage && task.has_forward() &&
                                 task.forward_chunk == schedule.first_chunk &&
                                 task.forward_model_chunk == 0;
  const bool backward_embedding =
      embedding_stage && task.has_backward() && task.backward_chunk == schedule.first_chunk &&
      task.backward_model_chunk == 0 && task.backward_split != BackwardSplit::kWeight;
  const int64_t nf = c.chunk_layers(task.forward_chunk, task.forward_model_chunk);
  const int64_t nb = c.chunk_layers(task.backward_chunk, task.backward_model_chunk);
  double time = 0;
  switch (task.kind) {
    case TaskKind::kForward:
      time = scaled_us(c.forward_chunk_us, c, nf);
      comm += scaled_comm(c.forward_comm, c, nf);
      break;
    case TaskKind::kBackward:
      switch (task.backward_split) {
        case BackwardSplit::kWhole:
          time = scaled_us(c.backward_chunk_us, c, nb);
          comm += scaled_comm(c.backward_comm, c, nb);
          break;
        case BackwardSplit::kInput:  // the communication is the input gradient's
          time = scaled_us(c.backward_chunk_us - c.backward_weight_chunk_us, c, nb);
          comm += scaled_comm(c.backward_comm, c, nb);
          break;
        case BackwardSplit::kWeight:
          time = scaled_us(c.backward_weight_chunk_us, c, nb);
          break;
      }
      break;
    case TaskKind::kSiBlock:
      time = si_block_time_us(c, nf, nb, comm);
      break;
    case TaskKind::kHeadLoss:
      return c.head_loss_forward_us + c.head_loss_backward_us;
  }
  if (forward_embedding) time += c.embedding_forward_us;
  if (backward_embedding) time += c.embedding_backward_us;
  return time;
}

// Live-activation bookkeeping of one stage (the header's memory model).
class ActivationTracker {
 public:
  explicit ActivationTracker(const StageCosts& costs)
      : down_bytes_(kept_bytes(costs, ChunkSide::kDown, costs.chunk_activation_bytes)),
        up_bytes_(kept_bytes(costs, ChunkSide::kUp, costs.up_chunk_activation_bytes)),
        layer_bytes_(costs.activation_bytes_per_layer),
        transient_bytes_(costs.backward_transient_bytes),
        forward_transient_bytes_(costs.forward_transient_bytes),
        head_loss_bytes_(costs.head_loss_transient_bytes),
        whole_forward_(costs.si_block_holds_whole_forward) {
    for (size_t i = 0; i < costs.model_chunk_layers.size(); ++i) {
      model_chunk_bytes_.push_back(i < costs.model_chunk_activation_bytes.size()
                                       ? costs.model_chunk_activation_bytes[i]
                                       : costs.model_chunk_layers[i] *
                                             costs.activation_bytes_per_layer);
    }
  }

  void run(StageSimulation& stage, const TimelineEntry& entry) {
    const PipelineTask& task = entry.task;
    switch (task.kind) {
      case TaskKind::kForward:
        live_ += bytes(task.forward_chunk, task.forward_model_chunk);
        // All-gather CP's gathered K/V ride on top while the forward runs.
        record(stage, entry.start_us, live_ + forward_transient_bytes_);
        if (forward_transient_bytes_ > 0) record(stage, entry.end_us, live_);
        break;
      case TaskKind::kBackward:
        // A split backward keeps the chunk's activations until its weight gradient (the
        // wgrad GEMMs read the saved inputs) and holds the recompute group during I.
        if (transient_bytes_ > 0 && task.backward_split != BackwardSplit::kWeight) {
          record(stage, entry.start_us, live_ + transient_bytes_);
        }
        if (task.backward_split != BackwardSplit::kInput) {
          live_ -= bytes(task.backward_chunk, task.backward_model_chunk);
        }
        record(stage, entry.end_us, live_);
        break;
      case TaskKind::kSiBlock: {  // +one layer at the worst layer pair (or a whole chunk)
        const int64_t after = live_ + bytes(task.forward_chunk) - bytes(task.backward_chunk);
        const int64_t peak = whole_forward_ ? live_ + bytes(task.forward_chunk)
                                            : std::max(live_, after) + layer_bytes_;
        record(stage, entry.start_us, peak + transient_bytes_ + forward_transient_bytes_);
        live_ = after;
        record(stage, entry.end_us, live_);
        break;
      }
      case TaskKind::kHeadLoss:
        record(stage, entry.start_us, live_ + head_loss_bytes_);
        record(stage, entry.end_us, live_);
        break;
    }
  }

 private:
  static int64_t kept_bytes(const StageCosts& c, ChunkSide side, int64_t given) {
    return given >= 0 ? given : c.chunk_layers(side) * c.activation_bytes_per_layer;
  }

  int64_t bytes(ChunkSide side, int64_t model_chunk = 0) const {
    if (!model_chunk_bytes_.empty()) return model_chunk_bytes_.at(static_cast<size_t>(model_chunk));
    return side == ChunkSide::kUp ? up_bytes_ : down_bytes_;
  }

  static void record(StageSimulation& stage, double time_us, int64_t bytes) {
    stage.activation_curve.push_back(MemoryPoint{time_us, bytes});
    if (bytes > stage.peak_activation_bytes) {
      stage.peak_activation_bytes = bytes;
      stage.peak_activation_time_us = time_us;
    }
  }

  int64_t down_bytes_;
  int64_t up_bytes_;
  int64_t layer_bytes_;
  int64_t transient_bytes_;
  int64_t forward_transient_bytes_;
  int64_t head_loss_bytes_;
  bool whole_forward_;
  std::vector<int64_t> model_chunk_bytes_;  ///< interleaved chunks of differing layers
  int64_t live_ = 0;
};

struct SimState {
  const PipelineSchedule& schedule;
  const std::vector<StageCosts>& costs;
  EndTimes ends;
  std::vector<size_t> next;
  std::vector<double> free_us;
  std::vector<ActivationTracker> trackers;
  PipelineSimulation result;
};

// Starts `stage`'s next task if all its inputs are done; false otherwise.
bool try_run_next(SimState& s, int64_t stage) {
  const auto p = static_cast<size_t>(stage);
  const PipelineTask& task = s.schedule.stages[p][s.next[p]];
  const std::vector<WorkItem> work = task_work(task, stage);
  double inputs_done_us = s.free_us[p];  // stage free and every producer's task ended
  double arrival_us = s.free_us[p];      // ... and every transfer arrived
  double transfer_us = 0;
  int64_t transfers = 0;
  int64_t bytes = 0;
  for (const WorkItem& item : work) {
    for (const WorkItem& input : work_inputs(s.schedule, item)) {
      const double end = s.ends.at(input);
      if (end == kNotDone) return false;
      inputs_done_us = std::max(inputs_done_us, end);
      if (input.stage == stage) {
        arrival_us = std::max(arrival_us, end);
        continue;
      }
      const StageCosts& sender = s.costs[static_cast<size_t>(input.stage)];
      arrival_us = std::max(arrival_us, end + sender.p2p_us);
      transfer_us += sender.p2p_us;
      transfers += 1;
      bytes += sender.p2p_bytes;
    }
  }
  StageSimulation& out = s.result.stages[p];
  const double time = task_time_us(s.schedule, s.costs[p], stage, task, out.comm);
  const TimelineEntry entry{task, arrival_us, arrival_us + time};
  const double pp_exposed = arrival_us - inputs_done_us;
  out.comm[ParallelDim::kPp].exposed_us += pp_exposed;
  out.comm[ParallelDim::kPp].hidden_us += transfer_us - pp_exposed;
  out.p2p_received += transfers;
  s.result.p2p_transfers += transfers;
  s.result.p2p_bytes += bytes;
  out.timeline.push_back(entry);
  out.busy_us += time;
  s.trackers[p].run(out, entry);
  for (const WorkItem& item : work) s.ends.at(item) = entry.end_us;
  s.free_us[p] = entry.end_us;
  s.next[p] += 1;
  return true;
}

[[noreturn]] void report_deadlock(const SimState& s) {
  std::string waiting;
  for (size_t p = 0; p < s.next.size(); ++p) {
    if (s.next[p] >= s.schedule.stages[p].size()) continue;
    waiting += fmt::format(" stage {} at {};", p, s.schedule.stages[p][s.next[p]].label());
  }
  throw Error(ErrorCode::kInternal, fmt::format("pipeline simulation: the {} schedule deadlocks:{}",
                                                pipeline_shape_name(s.schedule.shape), waiting));
}

void summarize(SimState& s) {
  PipelineSimulation& r = s.result;
  for (size_t p = 0; p < r.stages.size(); ++p) {
    StageSimulation& stage = r.stages[p];
    stage.last_end_us = s.free_us[p];
    stage.finish_us = stage.last_end_us + s.costs[p].dp_reduce_us + s.costs[p].optimizer_us;
    stage.comm[ParallelDim::kDp].exposed_us += s.costs[p].dp_reduce_us;
    stage.comm[ParallelDim::kDp].hidden_us += s.costs[p].dp_hidden_us;
    r.pipeline_us = std::max(r.pipeline_us, stage.last_end_us);
    r.iteration_us = std::max(r.iteration_us, stage.finish_us);
    r.comm += stage.comm;
  }
  double idle_us = 0;
  for (const StageSimulation& stage : r.stages) idle_us += r.pipeline_us - stage.busy_us;
  const double total_us = r.pipeline_us * static_cast<double>(r.stages.size());
  r.bubble_ratio = total_us > 0 ? idle_us / total_us : 0.0;
}

}  // namespace

PipelineSimulation simulate_pipeline(const PipelineSchedule& schedule,
                                     const std::vector<StageCosts>& costs) {
  check_costs(schedule, costs);
  const auto pp = static_cast<size_t>(schedule.pp);
  SimState s{schedule,
             costs,
             EndTimes(schedule.pp, schedule.num_micro_batches, schedule.model_chunks),
             std::vector<size_t>(pp, 0),
             std::vector<double>(pp, 0.0),
             {},
             {}};
  for (const StageCosts& c : costs) s.trackers.emplace_back(c);
  s.result.stages.resize(pp);
  // Any stage whose next task is ready may run it; a task's times depend only on its
  // inputs' ends and its stage's previous task, so the sweep order changes nothing.
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t p = 0; p < pp; ++p) {
      while (s.next[p] < schedule.stages[p].size() && try_run_next(s, static_cast<int64_t>(p))) {
        progress = true;
      }
    }
  }
  for (size_t p = 0; p < pp; ++p) {
    if (s.next[p] < schedule.stages[p].size()) report_deadlock(s);
  }
  summarize(s);
  return s.result;
}

std::vector<int64_t> activation_peaks(const PipelineSchedule& schedule,
                                      const std::vector<StageCosts>& costs) {
  check_costs(schedule, costs);
  std::vector<int64_t> peaks;
  for (size_t p = 0; p < costs.size(); ++p) {
    ActivationTracker tracker(costs[p]);
    StageSimulation stage;
    for (const PipelineTask& task : schedule.stages[p]) tracker.run(stage, {task, 0.0, 0.0});
    peaks.push_back(stage.peak_activation_bytes);
  }
  return peaks;
}

}  // namespace dhelix
