#include "planner/layer_costs.h"

#include "planner/fsdp_si_prefetch.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "lib/dag_builder.h"
#include "lib/dag_builder_intra_batch.h"
#include "planner/block_launch.h"
#include "planner/layer_baselines.h"
#include "planner/pairing_search.h"
#include "planner/profile_co_run.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

using Interval = std::pair<double, double>;

// Sorted, disjoint union of intervals.
std::vector<Interval> merge(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& i : intervals) {
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double overlap_us(const Interval& span, const std::vector<Interval>& covered) {
  double total = 0;
  for (const Interval& c : covered) {
    total += std::max(0.0, std::min(span.second, c.second) - std::max(span.first, c.first));
  }
  return total;
}

const StrandKinds& kinds_of(Strand strand, const StrandKinds& f, const StrandKinds& b) {
  return strand == Strand::kForward ? f : b;
}

// Where the block's communication ops ran and what of it a kernel covered.
struct CommSpan {
  ParallelDim group;
  Interval span;
  double hidden_us;
};

// How much longer than solo each compute op of the block ran, moved from hidden to exposed
// over the collectives beside it in proportion to their overlap (the file comment of
// layer_costs.h).
void charge_slowdowns(const BlockSimulation& sim, const StrandKinds& f, const StrandKinds& b,
                      std::vector<CommSpan>& comms) {
  for (const OpTiming& t : sim.ops) {
    const StrandKinds& k = kinds_of(t.strand, f, b);
    const size_t i = static_cast<size_t>(t.op) % k.stream.size();
    if (k.stream[i] != StreamClass::kCompute || k.solo_us.empty()) continue;
    const double slowed = (t.finish_us - t.start_us) - k.solo_us[i];
    if (slowed <= 0) continue;
    std::vector<double> beside(comms.size());
    double total = 0;
    for (size_t c = 0; c < comms.size(); ++c) {
      beside[c] = overlap_us({t.start_us, t.finish_us}, {comms[c].span});
      total += beside[c];
    }
    if (total <= 0) continue;
    for (size_t c = 0; c < comms.size(); ++c) {
      comms[c].hidden_us -= std::min(comms[c].hidden_us, slowed * beside[c] / total);
    }
  }
}

void add_block_comm(const BlockSimulation& sim, const StrandKinds& f, const StrandKinds& b,
                    CommBreakdown& out) {
  std::vector<Interval> compute;
  for (const OpTiming& t : sim.ops) {
    const StrandKinds& k = kinds_of(t.strand, f, b);
    const size_t i = static_cast<size_t>(t.op) % k.stream.size();
    if (k.stream[i] == StreamClass::kCompute) compute.emplace_back(t.start_us, t.finish_us);
  }
  const std::vector<Interval> covered = merge(std::move(compute));
  std::vector<CommSpan> comms;
  for (const OpTiming& t : sim.ops) {
    const StrandKinds& k = kinds_of(t.strand, f, b);
    const size_t i = static_cast<size_t>(t.op) % k.stream.size();
    if (k.stream[i] == StreamClass::kCompute) continue;
    const Interval span{t.start_us, t.finish_us};
    comms.push_back({k.group[i], span, overlap_us(span, covered)});
  }
  charge_slowdowns(sim, f, b, comms);
  // A paired block's launch interval (planner/block_launch.h): the time before its first op
  // starts, exposed communication of the block's collectives in proportion to their time.
  double launch_us = std::numeric_limits<double>::infinity();
  for (const OpTiming& t : sim.ops) launch_us = std::min(launch_us, t.start_us);
  double comm_us = 0;
  for (const CommSpan& c : comms) comm_us += c.span.second - c.span.first;
  for (const CommSpan& c : comms) {
    const double wall_us = c.span.second - c.span.first;
    CommTime& time = out[c.group];
    time.hidden_us += c.hidden_us;
    time.exposed_us += wall_us - c.hidden_us;
    if (launch_us > 0 && comm_us > 0) time.exposed_us += launch_us * wall_us / comm_us;
  }
}

std::function<double(const Op&)> solo_lookup(const Profile& profile) {
  return [&profile](const Op& op) { return profile_solo_time_us(profile, op); };
}

// One DAG alone with its best single-strand schedule (cut into pieces when it exceeds a
// StrandGraph; layer_baselines.h), with its communication, told by the ops of `kinds_dag`
// (the DAG itself unless a baseline moved some communication onto the compute stream).
double alone_us(const LayerDag& dag, const Profile& profile, const CoRunModel& co_run,
                Strand strand, CommBreakdown* comm, PairingMemo* memo = nullptr,
                const LayerDag* kinds_dag = nullptr) {
  const SingleStrandSchedule schedule =
      single_strand_schedule(dag, solo_lookup(profile), co_run, strand, {}, memo);
  if (comm != nullptr) {
    for (size_t i = 0; i < schedule.pieces.size(); ++i) {
      const StrandKinds kinds =
          strand_kinds(schedule.pieces[i], kinds_dag != nullptr ? *kinds_dag : dag);
      *comm += blocks_comm(schedule.blocks[i], kinds, kinds);
    }
  }
  return schedule.total_time_us;
}

// Forward and backward of a DAG pair, each alone.
LayerCosts strands_alone(const LayerDags& dags, const Profile& profile, const CoRunModel& co_run,
                         PairingMemo* memo) {
  LayerCosts costs;
  costs.forward_us =
      alone_us(dags.forward, profile, co_run, Strand::kForward, &costs.forward_comm, memo);
  costs.backward_us =
      alone_us(dags.backward, profile, co_run, Strand::kBackward, &costs.backward_comm, memo);
  return costs;
}

// Megatron-LM issues the collectives of --cp-comm-type a2a, a2a+p2p (the all-to-alls) and
// allgather synchronously on the compute stream (TransformerEngine: "The all-gather is not
// async, and cannot be overlapped"; the all-to-alls wait before the attention reads their
// output), unlike the p2p ring's send/recvs. Its baseline therefore runs them as compute
// ops: no compute of the layer hides them. True when `op` is one of them.
bool issued_on_compute_stream(const Op& op) {
  return is_communication(op.kind) && op.group == ParallelDim::kCp && op.kind != OpKind::kSendRecv;
}

LayerDag on_compute_stream(LayerDag dag) {
  for (int64_t i = 0; i < dag.size(); ++i) {
    if (issued_on_compute_stream(dag.op(i))) dag.mutable_op(i).stream = StreamClass::kCompute;
  }
  return dag;
}

bool has_synchronous_cp_collective(const LayerDags& dags) {
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t i = 0; i < dag->size(); ++i) {
      if (issued_on_compute_stream(dag->op(i))) return true;
    }
  }
  return false;
}

// The strands alone as Megatron issues them: its synchronous CP collectives exposed.
LayerCosts megatron_strands_alone(const LayerDags& dags, const Profile& profile,
                                  const CoRunModel& co_run, PairingMemo* memo) {
  LayerCosts costs;
  costs.forward_us = alone_us(on_compute_stream(dags.forward), profile, co_run, Strand::kForward,
                              &costs.forward_comm, memo, &dags.forward);
  costs.backward_us = alone_us(on_compute_stream(dags.backward), profile, co_run, Strand::kBackward,
                               &costs.backward_comm, memo, &dags.backward);
  return costs;
}

// `job` without FSDP: the same layers, no parameter gathers or gradient reduce-scatters.
JobSpec without_fsdp(JobSpec job) {
  job.parallel.use_megatron_fsdp = false;
  return job;
}

// A baseline's strands alone under FSDP as the frameworks run it (planner/fsdp_prefetch.h):
// the layer DAGs without FSDP's collectives (the intra-batch ones when `intra_batch`), each
// strand alone, then the collectives prefetched one layer ahead, with S and C taken from
// `dags`, the layer's DAGs with them.
LayerCosts fsdp_prefetched(const JobSpec& job, int64_t rank, bool intra_batch,
                           const LayerDags& dags, RecomputeGranularity recompute,
                           const Profile& profile, const CoRunModel& co_run, PairingMemo* memo) {
  const JobSpec plain = without_fsdp(job);
  const LayerDags plain_dags = with_recompute(
      intra_batch ? build_intra_batch_layer_dags(plain, rank) : build_layer_dags(plain, rank),
      recompute);
  FsdpPassCollectives forward = fsdp_pass_collectives(dags.forward, solo_lookup(profile));
  FsdpPassCollectives backward = fsdp_pass_collectives(dags.backward, solo_lookup(profile));
  forward.slowdown =
      fsdp_compute_slowdown(from_layer_dag(dags.forward, solo_lookup(profile)), co_run);
  backward.slowdown =
      fsdp_compute_slowdown(from_layer_dag(dags.backward, solo_lookup(profile)), co_run);
  return with_fsdp_prefetch(strands_alone(plain_dags, profile, co_run, memo), forward, backward);
}

// FSDP's collectives of one layer pair as dhelix prefetches them across SI blocks
// (planner/fsdp_si_prefetch.h): S and C of each pass, each pass's σ for a strand alone, and
// the pair's σ.
struct SiPrefetch {
  FsdpPassCollectives forward;
  FsdpPassCollectives backward;
  double pair_slowdown = 0;
};

SiPrefetch si_prefetch_of(const LayerAnalysis& a, const Profile& profile,
                          const CoRunModel& co_run) {
  SiPrefetch out;
  out.forward = fsdp_pass_collectives(a.dags.forward, solo_lookup(profile));
  out.backward = fsdp_pass_collectives(a.dags.backward, solo_lookup(profile));
  out.forward.slowdown = fsdp_compute_slowdown(a.forward, co_run);
  out.backward.slowdown = fsdp_compute_slowdown(a.backward, co_run);
  out.pair_slowdown = fsdp_pair_slowdown(a.forward, a.backward, co_run);
  return out;
}

// `layer_pairs` SI blocks of the plain pairing lasting `paired_us` with their prefetches.
PrefetchedStrand prefetched_chunk(const SiPrefetch& f, double paired_us, int64_t layer_pairs) {
  return prefetched_si_block(
      paired_us, si_block_collectives(f.forward, f.backward, f.pair_slowdown, layer_pairs));
}

void add_dp(CommBreakdown& comm, const PrefetchedStrand& prefetched) {
  comm[ParallelDim::kDp].hidden_us += prefetched.hidden_us;
  comm[ParallelDim::kDp].exposed_us += prefetched.exposed_us;
}

// dhelix's layer costs and chunk SI block, priced by the search without FSDP, with FSDP's
// collectives prefetched: the strands alone as the baselines', the pair and the chunk
// across SI blocks.
void apply_si_prefetch(const SiPrefetch& f, LayerAnalysis& a) {
  const double pair_us = a.dhelix_layer.si_pair_us;
  a.dhelix_layer = with_fsdp_prefetch(std::move(a.dhelix_layer), f.forward, f.backward);
  const PrefetchedStrand pair = prefetched_chunk(f, pair_us, 1);
  a.dhelix_layer.si_pair_us = pair.time_us;
  add_dp(a.dhelix_layer.si_pair_comm, pair);
  const PrefetchedStrand chunk = prefetched_chunk(f, a.chunk_si_block_us, a.chunk_layers);
  a.chunk_si_block_us = chunk.time_us;
  add_dp(a.chunk_si_block_comm, chunk);
}

// Forward and backward alone from the dhelix search's own single-strand schedules.
LayerCosts alone_from(const PairingResult& result, const StrandKinds& f, const StrandKinds& b) {
  LayerCosts costs;
  costs.forward_us = result.forward_alone_us;
  costs.backward_us = result.backward_alone_us;
  costs.forward_comm = blocks_comm(result.forward_alone_blocks, f, b);
  costs.backward_comm = blocks_comm(result.backward_alone_blocks, f, b);
  return costs;
}

// The weight-gradient work W of one layer's backward (backward_work): its ops' solo times.
double weight_gradient_us(const StrandGraph& backward, const LayerDag& dag) {
  double total = 0;
  for (const StrandOp& s : backward.ops()) {
    if (backward_work(dag.op(*dag.find(s.id))) == BackwardWork::kWeightGradient) {
      total += s.solo_time_us;
    }
  }
  return total;
}

std::string timed_op_id(const StrandGraph& layer, int64_t index, bool window) {
  const int64_t n = layer.size();
  const std::string& id = layer.op(index % n).id;
  return window ? "L" + std::to_string(index / n) + "." + id : id;
}

std::vector<PlanBlock> block_records(const std::vector<PairingBlock>& blocks, const StrandGraph& f,
                                     const StrandGraph& b, bool window) {
  std::vector<PlanBlock> out;
  for (const PairingBlock& block : blocks) {
    PlanBlock record;
    record.time_us = block.time_us;
    for (const OpTiming& t : block.simulation.ops) {
      const bool forward = t.strand == Strand::kForward;
      const std::string id = timed_op_id(forward ? f : b, t.op, window);
      (forward ? record.forward_ops : record.backward_ops).push_back(id);
      record.timings.push_back({.strand = forward ? Pass::kForward : Pass::kBackward,
                                .op = id,
                                .start_us = t.start_us,
                                .finish_us = t.finish_us});
    }
    out.push_back(std::move(record));
  }
  return out;
}

std::vector<PlanOp> op_records(const StrandGraph& graph, const LayerDag& dag) {
  std::vector<PlanOp> out;
  for (const StrandOp& s : graph.ops()) {
    const Op& op = dag.op(*dag.find(s.id));
    out.push_back({.id = s.id,
                   .kind = op.kind,
                   .stream = op.stream,
                   .group = is_communication(op.kind) ? std::optional(op.group) : std::nullopt,
                   .signature = op.signature(),
                   .solo_us = s.solo_time_us});
  }
  return out;
}

// A hand-written order's layer costs: the strands alone as Megatron runs them, the SI pair
// from the order's blocks; without all-to-alls the strands one after the other exactly.
LayerCosts handwritten_layer(const LayerCosts& megatron, const PairingResult& pair,
                             bool has_all_to_all, const StrandKinds& fk, const StrandKinds& bk) {
  LayerCosts out = megatron;
  if (!has_all_to_all) {
    out.si_pair_us = megatron.forward_us + megatron.backward_us;
    out.si_pair_comm = megatron.forward_comm;
    out.si_pair_comm += megatron.backward_comm;
    return out;
  }
  out.si_pair_us = pair.total_time_us;
  out.si_pair_comm = blocks_comm(pair.blocks, fk, bk);
  return out;
}

// The hand-written orders of handwritten_pairs.h on the same layer pair as the search's
// one-layer scope, with its launch interval; Megatron's scheme keeps its better variant.
void set_handwritten(const CoRunModel& co_run, double paired_block_gap_us, const StrandKinds& fk,
                     const StrandKinds& bk, LayerAnalysis& a) {
  const BlockCostModel model(a.forward, a.backward, co_run, {}, paired_block_gap_us);
  const NodeAssignment nodes = node_assignment(a.dags.forward, a.dags.backward);
  a.has_all_to_all = nodes.has_all_to_all;
  a.deepseek = handwritten_pairing(model, nodes, HandwrittenOrder::kDeepSeekV3);
  PairingResult plain = handwritten_pairing(model, nodes, HandwrittenOrder::kMegatronA2a);
  PairingResult delayed = handwritten_pairing(model, nodes, HandwrittenOrder::kMegatronA2aDelayedW);
  a.megatron_delayed_wgrad = delayed.total_time_us < plain.total_time_us;
  a.megatron_a2a = a.megatron_delayed_wgrad ? std::move(delayed) : std::move(plain);
  a.deepseek_layer = handwritten_layer(a.megatron, a.deepseek, a.has_all_to_all, fk, bk);
  a.megatron_a2a_layer = handwritten_layer(a.megatron, a.megatron_a2a, a.has_all_to_all, fk, bk);
}

}  // namespace

StrandKinds strand_kinds(const StrandGraph& graph, const LayerDag& dag) {
  StrandKinds kinds;
  for (const StrandOp& s : graph.ops()) {
    const Op& op = dag.op(*dag.find(s.id));
    kinds.stream.push_back(op.stream);
    kinds.group.push_back(op.group);
    kinds.solo_us.push_back(s.solo_time_us);
  }
  return kinds;
}

CommBreakdown blocks_comm(const std::vector<PairingBlock>& blocks, const StrandKinds& forward,
                          const StrandKinds& backward) {
  CommBreakdown out;
  for (const PairingBlock& block : blocks) add_block_comm(block.simulation, forward, backward, out);
  return out;
}

double single_strand_time_us(const LayerDag& dag, const Profile& profile,
                             const CoRunModel& co_run) {
  if (dag.size() == 0) return 0;
  return alone_us(dag, profile, co_run, Strand::kForward, nullptr);
}

LayerAnalysis analyze_layers(const JobSpec& job, int64_t rank, const Profile& profile,
                             const CoRunModel& co_run, int64_t chunk_layers,
                             int64_t cross_layer_max_segment_ops, RecomputeGranularity recompute,
                             PairingMemo* memo) {
  LayerAnalysis a;
  a.chunk_layers = chunk_layers;
  a.dags = with_recompute(build_layer_dags(job, rank), recompute);
  a.forward = from_layer_dag(a.dags.forward, solo_lookup(profile));
  a.backward = from_layer_dag(a.dags.backward, solo_lookup(profile));
  const StrandKinds fk = strand_kinds(a.forward, a.dags.forward);
  const StrandKinds bk = strand_kinds(a.backward, a.dags.backward);
  a.fsdp_prefetch = job.parallel.fsdp_shards_parameters();
  a.paired_forward = a.forward;
  a.paired_backward = a.backward;
  if (a.fsdp_prefetch) {
    const LayerDags plain = with_recompute(build_layer_dags(without_fsdp(job), rank), recompute);
    a.paired_forward = from_layer_dag(plain.forward, solo_lookup(profile));
    a.paired_backward = from_layer_dag(plain.backward, solo_lookup(profile));
  }
  const StrandKinds pfk = strand_kinds(a.paired_forward, a.dags.forward);
  const StrandKinds pbk = strand_kinds(a.paired_backward, a.dags.backward);

  // DHelix: the exact search, one-layer and cross-layer scopes.
  ChunkPairingOptions options;
  options.num_layers = chunk_layers;
  options.cross_layer.max_segment_ops = cross_layer_max_segment_ops;
  options.memo = memo;
  options.per_layer.paired_block_gap_us = paired_block_gap_us(job.parallel);
  options.cross_layer.paired_block_gap_us = options.per_layer.paired_block_gap_us;
  a.dhelix = search_chunk_pairing(a.paired_forward, a.paired_backward, co_run, options);
  a.megatron = has_synchronous_cp_collective(a.dags)
                   ? megatron_strands_alone(a.dags, profile, co_run, memo)
                   : alone_from(a.dhelix.per_layer, pfk, pbk);
  if (a.fsdp_prefetch) {
    a.megatron = fsdp_prefetched(job, rank, false, a.dags, recompute, profile, co_run, memo);
  }
  a.megatron.backward_weight_us = weight_gradient_us(a.backward, a.dags.backward);
  // DHelix's strands alone are its own schedules, whatever Megatron's are.
  a.dhelix_layer = alone_from(a.dhelix.per_layer, pfk, pbk);
  a.dhelix_layer.backward_weight_us = a.megatron.backward_weight_us;
  a.dhelix_layer.si_pair_us = a.dhelix.per_layer.total_time_us;
  a.dhelix_layer.si_pair_comm = blocks_comm(a.dhelix.per_layer.blocks, pfk, pbk);
  a.chunk_scope = a.dhelix.cross_layer_better;
  std::optional<SiPrefetch> fsdp;
  if (a.fsdp_prefetch) {
    // The scopes compared with FSDP's collectives beside them, as they will run.
    fsdp = si_prefetch_of(a, profile, co_run);
    a.chunk_scope = prefetched_chunk(*fsdp, a.dhelix.cross_layer_chunk_us, chunk_layers).time_us <
                    prefetched_chunk(*fsdp, a.dhelix.per_layer_chunk_us, chunk_layers).time_us;
  }
  if (a.chunk_scope) {
    const double windows = static_cast<double>(chunk_layers / a.dhelix.window_layers);
    a.chunk_si_block_us = a.dhelix.cross_layer_chunk_us;
    a.chunk_si_block_comm = blocks_comm(a.dhelix.cross_window.blocks, pfk, pbk).scaled(windows);
    a.chunk_si_block_comm += blocks_comm(a.dhelix.cross_remainder.blocks, pfk, pbk);
  } else {
    a.chunk_si_block_us = a.dhelix.per_layer_chunk_us;
    a.chunk_si_block_comm = a.dhelix_layer.si_pair_comm.scaled(static_cast<double>(chunk_layers));
  }
  if (fsdp) apply_si_prefetch(*fsdp, a);

  // Wavelet+: round-robin pairing of the same layer pair.
  const BlockCostModel layer_model(a.forward, a.backward, co_run);
  a.wavelet = round_robin_pairing(layer_model);
  a.wavelet_layer = a.megatron;
  a.wavelet_layer.si_pair_us = a.wavelet.total_time_us;
  a.wavelet_layer.si_pair_comm = blocks_comm(a.wavelet.blocks, fk, bk);

  set_handwritten(co_run, options.per_layer.paired_block_gap_us, fk, bk, a);

  // Intra-batch: the chunked DAGs, each strand alone.
  a.intra_batch =
      job.parallel.fsdp_shards_parameters()
          ? fsdp_prefetched(job, rank, true, a.dags, recompute, profile, co_run, memo)
          : strands_alone(with_recompute(build_intra_batch_layer_dags(job, rank), recompute),
                          profile, co_run, memo);
  return a;
}

PlanPairing pairing_record(const LayerAnalysis& a) {
  PlanPairing p;
  p.forward_ops = op_records(a.paired_forward, a.dags.forward);
  p.backward_ops = op_records(a.paired_backward, a.dags.backward);
  p.scope = a.chunk_scope ? PairingScope::kChunk : PairingScope::kLayer;
  p.chunk_layers = a.chunk_layers;
  p.layer_scope_us = a.dhelix.per_layer_chunk_us;
  p.chunk_scope_us = a.dhelix.cross_layer_chunk_us;
  p.window_layers = a.dhelix.window_layers;
  p.sequential_us = a.dhelix.sequential_chunk_us;
  p.layer_pair_us = a.dhelix.per_layer.total_time_us;
  p.layer_blocks =
      block_records(a.dhelix.per_layer.blocks, a.paired_forward, a.paired_backward, false);
  p.layer_segment_bound = a.dhelix.layer_segment_bound;
  p.window_segment_bound = a.dhelix.window_segment_bound;
  if (a.dhelix.window_layers >= 2) {
    p.window_blocks =
        block_records(a.dhelix.cross_window.blocks, a.paired_forward, a.paired_backward, true);
    p.remainder_blocks =
        block_records(a.dhelix.cross_remainder.blocks, a.paired_forward, a.paired_backward, true);
  }
  return p;
}

}  // namespace dhelix
