#pragma once
// A plan (schemas/plan.schema.json): everything dhelix-plan decided for one job, in a form
// the runtime (dhelix-run) can execute and dhelix-diff can compare. It is self-contained:
// it carries the job (model, cluster, parallel settings) it was made for, hashes of those
// inputs and of the profile, the layer pairings (the SI block templates), every stage's
// ordered task list with predicted times, and the predicted figures of the schemes dhelix
// compares (dhelix, wavelet+, intra-batch, megatron-1f1b, megatron-interleaved, zb-h1, zb-v
// and, with at least 2·pp micro-batches, dualpipev).
//
// Shape of the file (key order as written; lib/plan/plan_writer.h):
//
//   schema_version, meta (provenance)
//   inputs:   model {name, sha256}, parallel {...}, cluster {name, sha256},
//             profile {backend, sha256 | "generated:model"}
//   job:      name, model {...}, cluster {...}, parallel {...}
//   options:  allow_oom, distributed_optimizer, cross_layer_max_segment_ops, fsdp (optional:
//             sharding_strategy, reshard_after_forward)
//   num_micro_batches
//   pairings: distinct layer pairings, referred to by stages[i].pairing
//   stages:   ranks, down/up layer ranges, embedding/head_loss, task list, phases (p2p
//             transfers, DP reduction, optimizer step)
//   memory_budget: the GPU's capacity, reserve and usable bytes
//   schemes:  one per scheme: iteration time, bubble, throughput, communication, memory
//
// docs/plan.md describes every field and how the planner fills it.
//
// Op ids are the layer DAG's ids (lib/dag_builder.h), stable across runs. In a cross-layer
// ("chunk" scope) block an op of the k-th layer of the window is "L<k>.<id>".
//
// Times are microseconds, sizes bytes; the writer rounds times to 3 decimals and ratios to
// 6, so that a plan read back and written again gives the same bytes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "lib/op_catalogue.h"
#include "lib/parallel_spec.h"
#include "lib/plan/plan_kinds.h"

namespace dhelix {

/// Version of the plan format this dhelix writes; readers accept major 1 only.
/// 1.1.0 added the schemes megatron-interleaved, zb-h1, zb-v, dualpipev, the shapes
/// "interleaved" and "v", chunks_per_stage, and each stage's optional "phases"; 1.0.0 plans
/// still read (chunks_per_stage then comes from the shape, and traces have no phase rows).
/// 1.2.0 added the pairings' optional layer_segment_bound and window_segment_bound.
/// 1.3.0 added the dhelix plan's shapes: the optional shape_choice, stages in the V, and a
/// backward part's optional "work" (whole | input | weight: the split backward of the
/// zero-bubble schedules); absent means whole, so older plans read unchanged.
/// 1.4.0 added options.fsdp (Megatron-FSDP's sharding strategy and reshard_after_forward).
/// A plan without it is written as 1.3.0 (plan_schema_version), so that the plans of jobs
/// without FSDP stay byte for byte what they were.
/// 1.5.0 added the dhelix plan on interleaved stages (shape_choice requested / chosen
/// "interleaved"): a stage's optional model_chunks (its layer ranges, Megatron's virtual
/// stages c·pp + p), a task part's optional model_chunk, and a shape candidate's optional
/// si_blocks. Only plans on interleaved stages are written as 1.5.0 (plan_schema_version;
/// the others do not list interleaved candidates), so that every other plan keeps its bytes.
inline constexpr const char* kPlanSchemaVersionInterleaved = "1.5.0";
inline constexpr const char* kPlanSchemaVersion = "1.4.0";
inline constexpr const char* kPlanSchemaVersionWithoutFsdp = "1.3.0";
inline constexpr int kPlanSchemaMajor = 1;

/// An input the plan was made for, named and hashed. For the profile, `name` is the
/// backend ("model", "cpu", "cuda") and `sha256` the hash of the profile file, or
/// "generated:model" when dhelix-plan made the profile itself.
struct PlanInputRef {
  std::string name;
  std::string sha256;
};

/// Provenance of the plan's inputs.
struct PlanInputs {
  PlanInputRef model;    ///< model name; sha256 of model_to_json(model).dump()
  OrderedJson parallel;  ///< parallel_to_json(job.parallel)
  PlanInputRef cluster;  ///< cluster name; sha256 of cluster_to_json(cluster).dump()
  PlanInputRef profile;  ///< backend; sha256 of the file or "generated:model"
};

/// The job itself, so that a plan can be run without its input files.
struct PlanJob {
  std::string name;
  OrderedJson model;     ///< model_to_json
  OrderedJson cluster;   ///< cluster_to_json
  OrderedJson parallel;  ///< parallel_to_json
};

/// Choices the planner made or was told.
/// What the plan records of Megatron-FSDP (ParallelSpec::use_megatron_fsdp).
struct PlanFsdpRecord {
  FsdpShardingStrategy sharding_strategy = FsdpShardingStrategy::kNoShard;
  bool reshard_after_forward = true;
  bool operator==(const PlanFsdpRecord&) const = default;
};

struct PlanOptionsRecord {
  bool allow_oom = false;                   ///< --allow-oom: written even though it does not fit
  bool distributed_optimizer = true;        ///< optimizer states sharded over DP (memory model)
  int64_t cross_layer_max_segment_ops = 8;  ///< segment bound of the chunk scope search
  /// Present only when the job sets use_megatron_fsdp (plan format 1.4.0).
  std::optional<PlanFsdpRecord> fsdp;
};

/// The version a plan with these options is written as: kPlanSchemaVersion with fsdp,
/// kPlanSchemaVersionWithoutFsdp without; kPlanSchemaVersionInterleaved when the dhelix plan
/// runs on interleaved stages (`interleaved`).
inline const char* plan_schema_version(const PlanOptionsRecord& options, bool interleaved = false) {
  if (interleaved) return kPlanSchemaVersionInterleaved;
  return options.fsdp ? kPlanSchemaVersion : kPlanSchemaVersionWithoutFsdp;
}

/// One op of a layer strand.
struct PlanOp {
  std::string id;  ///< layer DAG id, e.g. "fwd.gemm_qkv"
  OpKind kind = OpKind::kGemm;
  StreamClass stream = StreamClass::kCompute;
  std::optional<ParallelDim> group;  ///< a communication op's group; none for compute ("")
  std::string signature;             ///< Op::signature(), the profile key
  double solo_us = 0;                ///< solo time from the profile
};

/// When one op of a block ran, relative to the block's start.
struct PlanOpTiming {
  Pass strand = Pass::kForward;  ///< "fwd" or "bwd"
  std::string op;                ///< op id ("L<k>.<id>" in chunk scope)
  double start_us = 0;
  double finish_us = 0;
};

/// One SI block of a template: ops that co-run from a common start to a barrier.
struct PlanBlock {
  double time_us = 0;
  std::vector<std::string> forward_ops;   ///< in start order
  std::vector<std::string> backward_ops;  ///< in start order
  std::vector<PlanOpTiming> timings;      ///< every op, in start order
};

/// Communication time of one type inside some work.
struct PlanCommTime {
  ParallelDim type = ParallelDim::kTp;  ///< "tp", "cp", "ep", "dp", "pp" in the file
  double hidden_us = 0;
  double exposed_us = 0;
};

/// How one layer's forward and one layer's backward are interleaved (and, for the chunk
/// scope, windows of several layers). Shared by every stage whose layer DAGs are the same.
struct PlanPairing {
  std::vector<PlanOp> forward_ops;            ///< one layer's forward ops, topological order
  std::vector<PlanOp> backward_ops;           ///< one layer's backward ops, topological order
  PairingScope scope = PairingScope::kLayer;  ///< the one the stage costs use
  int64_t chunk_layers = 0;                   ///< layers per chunk the scopes were compared for
  double layer_scope_us = 0;                  ///< chunk_layers x one layer pair (the paper's scope)
  double chunk_scope_us = 0;                  ///< windows of window_layers layers, barriers between
  int64_t window_layers = 0;                  ///< 1: no cross-layer window fitted
  double sequential_us = 0;                   ///< chunk_layers x (forward alone + backward alone)
  double layer_pair_us = 0;              ///< one layer's forward co-run with one layer's backward
  std::vector<PlanBlock> layer_blocks;   ///< the layer scope's blocks
  std::vector<PlanBlock> window_blocks;  ///< chunk scope: one full window's blocks
  std::vector<PlanBlock> remainder_blocks;  ///< chunk scope: the last, shorter window
  /// Most ops of one strand per block where the search's work budget bounded the segments
  /// (planner/pairing_search.h, 5.): the layer scope's search and the tightest of the chunk
  /// scope's windows; 0 = as the options ask (layer scope unbounded, windows
  /// options.cross_layer_max_segment_ops). In the file only when not 0.
  int64_t layer_segment_bound = 0;
  int64_t window_segment_bound = 0;
};

/// Layers first .. first+count-1.
struct PlanLayerRange {
  int64_t first = 0;
  int64_t count = 0;
};

/// One pass of a task through one chunk.
struct PlanTaskPart {
  int64_t micro_batch = 0;
  ChunkSide chunk = ChunkSide::kWhole;
  PlanLayerRange layers;
  /// Backward parts of backward tasks: which share of the backward runs (kInput: I, kWeight:
  /// W). "work" in the file, written only when not whole.
  BackwardShare work = BackwardShare::kWhole;
  /// Interleaved stages (1.5.0): the index of the part's model chunk in its stage's
  /// model_chunks, whose layers `layers` are; absent on every other shape.
  std::optional<int64_t> model_chunk = std::nullopt;
};

/// A task of another stage this task waits for (a point-to-point transfer).
struct PlanTaskRef {
  int64_t stage = 0;
  int64_t task = 0;  ///< index in that stage's task list
};

/// One entry of a stage's task list.
struct PlanTask {
  int64_t index = 0;
  TaskKind kind = TaskKind::kForward;
  std::string label;                    ///< "F3d+B1u", "H2", ...
  std::optional<PlanTaskPart> forward;  ///< forward and si_block tasks (null in the file otherwise)
  std::optional<PlanTaskPart> backward;  ///< backward and si_block tasks
  int64_t head_loss_micro_batch = -1;    ///< head_loss tasks only; -1 otherwise
  double start_us = 0;
  double end_us = 0;
  std::vector<PlanTaskRef> waits_for;
};

/// What a stage does beside and after its task list: the pipeline transfers it sends, the
/// data-parallel gradient reduction and parameter gather as Megatron overlaps them
/// (planner/dp_overlap.h), and the optimizer step. The stage's iteration ends at its last
/// task's end + dp_reduce_exposed_us + optimizer_us + dp_gather_exposed_us (the gather's
/// exposed part delays the next iteration's first forward; it is counted in this one); the
/// dhelix scheme's iteration_us is the latest such end over the stages.
struct PlanStagePhases {
  double p2p_us = 0;  ///< one activation or gradient sent to a neighbour stage; 0 when pp = 1
  StreamClass p2p_stream = StreamClass::kCrossComm;  ///< local_comm within a node
  double dp_reduce_hidden_us = 0;   ///< gradient reduction under the last backwards
  double dp_reduce_exposed_us = 0;  ///< gradient reduction after the stage's last task
  double dp_gather_hidden_us = 0;   ///< parameter gather under the first forwards
  double dp_gather_exposed_us = 0;  ///< parameter gather the first forward waits for
  StreamClass dp_stream = StreamClass::kCrossComm;  ///< local_comm within a node
  double optimizer_us = 0;                          ///< Adam step over the optimizer shard

  /// The stage's time after its last task: exposed reduction, optimizer step, exposed gather.
  double tail_us() const { return dp_reduce_exposed_us + optimizer_us + dp_gather_exposed_us; }
};

/// One pipeline stage of the dhelix (W) plan.
struct PlanStage {
  int64_t stage = 0;
  std::vector<int64_t> ranks;  ///< every rank of this pipeline coordinate, ascending
  int64_t shape_rank = 0;      ///< the rank whose DAG shapes were used (the first)
  int64_t pairing = 0;         ///< index into Plan::pairings
  PlanLayerRange down_layers;  ///< the W and the V; empty (count 0) on interleaved stages
  PlanLayerRange up_layers;
  /// Interleaved stages (1.5.0): the stage's model chunks in order, chunk c holding virtual
  /// stage c·pp + stage; empty on every other shape.
  std::vector<PlanLayerRange> model_chunks = {};
  bool embedding = false;
  bool head_loss = false;
  std::vector<PlanTask> tasks;
  /// Transfers, DP reduction and optimizer step; absent in plans written before 1.1.0.
  std::optional<PlanStagePhases> phases;

  /// Every layer range the stage holds: its model chunks, or its down and up chunks.
  std::vector<PlanLayerRange> layer_ranges() const {
    if (!model_chunks.empty()) return model_chunks;
    return {down_layers, up_layers};
  }
};

/// One GPU's memory on one stage under one scheme, bytes.
struct PlanStageMemory {
  int64_t stage = 0;
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activation_bytes = 0;  ///< peak of live activations
  int64_t total_bytes = 0;
};

/// The predicted figures of one scheme.
struct PlanScheme {
  PipelineScheme scheme = PipelineScheme::kDHelix;
  PipelineShape shape = PipelineShape::kW;
  /// Model chunks one stage holds: 1 (1f1b), 2 (w, v), Megatron's virtual pipeline size v
  /// (interleaved).
  int64_t chunks_per_stage = 1;
  double iteration_us = 0;
  double bubble_ratio = 0;
  double tokens_per_second = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double speedup_vs_megatron = 0;  ///< megatron-1f1b iteration time / this one
  /// Per type (tp, cp, ep, dp, pp, in that order), summed over stages and divided by pp:
  /// per GPU of an average stage, per iteration.
  std::vector<PlanCommTime> comm;
  int64_t p2p_transfers = 0;
  int64_t p2p_bytes = 0;
  bool fits = true;  ///< every stage fits in the usable memory
  std::vector<PlanStageMemory> memory;
};

/// One shape the planner tried for the dhelix plan (planner/dhelix_shapes.h).
struct PlanShapeCandidate {
  PipelineShape shape = PipelineShape::kW;
  /// The W: whether its lone backwards are split into input and weight gradients
  /// (planner/w_split_drain.h), and the most weight-gradient tasks left waiting (-1:
  /// unbounded). The V always splits where DualPipeV does.
  bool split_backward = false;
  int64_t max_deferred_weight_gradients = 0;
  /// Interleaved stages (1.5.0, written for them only): whether each step's forward and
  /// backward run as one SI block (Megatron's combined 1F1B order) or apart (its plain
  /// interleaved order).
  bool si_blocks = false;
  double iteration_us = 0;
  double bubble_ratio = 0;
  int64_t peak_bytes = 0;  ///< the largest stage's total memory
  bool fits = true;
};

/// How the dhelix plan's shape was chosen: what the user asked for, what was tried, the
/// shape written (the dhelix scheme's) and why.
struct PlanShapeChoice {
  ShapeRequest requested = ShapeRequest::kAuto;
  PipelineShape chosen = PipelineShape::kW;
  std::string reason;
  std::vector<PlanShapeCandidate> candidates;  ///< the chosen one first
};

/// What one GPU offers.
struct PlanMemoryBudget {
  std::string gpu;
  int64_t capacity_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t usable_bytes = 0;
};

struct Plan {
  std::string schema_version = kPlanSchemaVersion;
  OrderedJson meta = OrderedJson::object();  ///< provenance_to_json
  PlanInputs inputs;
  PlanJob job;
  PlanOptionsRecord options;
  int64_t num_micro_batches = 0;
  std::vector<PlanPairing> pairings;
  std::vector<PlanStage> stages;
  PlanMemoryBudget memory_budget;
  std::vector<PlanScheme> schemes;  ///< in PipelineScheme order; dualpipev may be absent
  /// How the dhelix plan's shape was chosen; absent in plans before 1.3.0 (always the W).
  std::optional<PlanShapeChoice> shape_choice;

  /// The figures of `scheme`, or nullptr when the plan lacks them.
  const PlanScheme* find_scheme(PipelineScheme scheme) const;
  /// The fastest scheme people run as it is priced (run_as_priced, plan_kinds.h) that fits
  /// in memory, or nullptr (none fits): what dhelix's gain is stated over.
  const PlanScheme* best_baseline() const;
  /// The generous dualpipev (its overlapped pairs from the exact pairing search) when the
  /// plan has it, it fits and it is timed: shown apart from the baselines, as the upper
  /// bound of what a hand-written DualPipeV reaches; nullptr otherwise.
  const PlanScheme* upper_bound() const;
};

}  // namespace dhelix
