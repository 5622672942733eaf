// Strict plan reader. Every object goes through an ObjectReader, so unknown keys are
// reported with a "did you mean"; arrays are walked element by element with their JSON
// pointers. The embedded job (model, cluster, parallel) and meta are kept as they are:
// the plan's own readers (dhelix-run) re-validate the job through the spec readers.

#include "lib/plan/plan_reader.h"

#include "lib/file_kind.h"
#include "lib/job_limits.h"
#include "lib/provenance.h"

#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/format.h>

namespace dhelix {
namespace {

using ElementFn = std::function<void(const Json& element, const std::string& pointer)>;

// Calls `each` for every element of the array at `key`; a non-array is a problem.
void for_each_element(ObjectReader& r, const std::string& key, const ElementFn& each) {
  const Json* value = r.raw(key, Need::kRequired);
  if (value == nullptr) return;
  if (!value->is_array()) {
    r.report(key, json_value_text(*value), "must be an array");
    return;
  }
  for (size_t i = 0; i < value->size(); ++i) {
    each((*value)[i], r.pointer_of(key) + "/" + std::to_string(i));
  }
}

std::vector<std::string> read_strings(ObjectReader& r, const std::string& key) {
  std::vector<std::string> out;
  for_each_element(r, key, [&](const Json& e, const std::string& pointer) {
    if (e.is_string()) {
      out.push_back(e.get<std::string>());
    } else {
      r.problems().add(r.file(), pointer, json_value_text(e), "must be a string");
    }
  });
  return out;
}

// Integers from 0 to `max` (nlohmann keeps a non-negative integer as unsigned).
std::vector<int64_t> read_integers(ObjectReader& r, const std::string& key, int64_t max) {
  std::vector<int64_t> out;
  for_each_element(r, key, [&](const Json& e, const std::string& pointer) {
    const bool integer = e.is_number_integer();
    const bool negative = integer && !e.is_number_unsigned() && e.get<int64_t>() < 0;
    if (!integer || negative) {
      r.problems().add(r.file(), pointer, json_value_text(e), "must be an integer >= 0");
    } else if (e.get<uint64_t>() > static_cast<uint64_t>(max)) {
      r.problems().add(r.file(), pointer, json_value_text(e),
                       fmt::format("must be at most {}", max));
    } else {
      out.push_back(static_cast<int64_t>(e.get<uint64_t>()));
    }
  });
  return out;
}

OrderedJson read_opaque_object(ObjectReader& r, const std::string& key) {
  const Json* value = r.raw(key, Need::kRequired);
  if (value == nullptr) return OrderedJson::object();
  if (!value->is_object()) {
    r.report(key, json_value_text(*value), "must be an object");
    return OrderedJson::object();
  }
  return OrderedJson::parse(value->dump());
}

constexpr IntRange kCount{.min = 0};
constexpr RealRange kTime{.min = 0};

double time_field(ObjectReader& r, const std::string& key) {
  return r.real(key, Need::kRequired, kTime).value_or(0);
}
int64_t count_field(ObjectReader& r, const std::string& key) {
  return r.integer(key, Need::kRequired, kCount).value_or(0);
}

// Fields that index or size what a reader of the plan builds (schedules, rank programs,
// per-micro-batch buffers) get the job's own limits (lib/job_limits.h), so that an edited
// plan with 2^62 layers or micro-batches is refused here, with its pointer, and never
// reaches an allocation. Indices are below the matching count's limit.
constexpr IntRange kLayerIndex{.min = 0, .max = kLayerCountRange.max};
constexpr IntRange kLayerCount{.min = 1, .max = kLayerCountRange.max};
constexpr IntRange kMicroBatchCount{.min = 1, .max = kMaxMicroBatches};
constexpr IntRange kMicroBatchIndex{.min = 0, .max = kMaxMicroBatches - 1};
constexpr IntRange kStageIndex{.min = 0, .max = kMaxParallelSize - 1};
constexpr IntRange kRankIndex{.min = 0, .max = kMaxWorldSize - 1};
// A stage runs at most a few tasks per micro-batch and chunk.
constexpr IntRange kTaskIndex{.min = 0, .max = 8 * kMaxMicroBatches};

int64_t bounded_field(ObjectReader& r, const std::string& key, IntRange range) {
  return r.integer(key, Need::kRequired, range).value_or(range.min);
}

// Reads the object at `key` (or at an element) with `fill`, then checks its keys.
template <typename Fill>
void with_object(ObjectReader& parent, const std::string& key, Fill fill) {
  std::optional<ObjectReader> child = parent.object(key, Need::kRequired);
  if (!child) return;
  fill(*child);
  child->finish();
}

template <typename Fill>
void with_element(ObjectReader& parent, const Json& element, const std::string& pointer,
                  Fill fill) {
  ObjectReader child(element, parent.file(), pointer, parent.problems());
  if (!child.is_object()) return;
  fill(child);
  child.finish();
}

// The enum at `key`, its allowed values and its conversion from one name table
// (lib/enum_names.h). A missing or unknown name is reported; `fallback` stands in for it.
template <typename Enum, size_t N>
Enum read_enum(ObjectReader& r, const std::string& key, const EnumNames<Enum, N>& names,
               Enum fallback) {
  const std::optional<std::string> text = r.string(key, Need::kRequired, names.all());
  return text ? names.parse(*text).value_or(fallback) : fallback;
}

PlanInputRef read_ref(ObjectReader& r, const char* name_key) {
  PlanInputRef ref;
  ref.name = r.string(name_key, Need::kRequired).value_or("");
  ref.sha256 = r.string("sha256", Need::kRequired).value_or("");
  return ref;
}

PlanOp read_op(ObjectReader& r) {
  PlanOp op;
  op.id = r.string("id", Need::kRequired).value_or("");
  op.kind = read_enum(r, "kind", kOpKindNames, OpKind::kGemm);
  op.stream = read_enum(r, "stream", kStreamClassNames, StreamClass::kCompute);
  // A compute op's group is "": no process group.
  std::vector<std::string> groups = kParallelDimNames.all();
  groups.insert(groups.begin(), "");
  const std::string group = r.string("group", Need::kRequired, groups).value_or("");
  op.group = kParallelDimNames.parse(group);
  op.signature = r.string("signature", Need::kRequired).value_or("");
  op.solo_us = time_field(r, "solo_us");
  return op;
}

std::vector<PlanOp> read_ops(ObjectReader& r, const std::string& key) {
  std::vector<PlanOp> ops;
  for_each_element(r, key, [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) { ops.push_back(read_op(o)); });
  });
  return ops;
}

PlanBlock read_block(ObjectReader& r) {
  PlanBlock block;
  block.time_us = time_field(r, "time_us");
  block.forward_ops = read_strings(r, "forward_ops");
  block.backward_ops = read_strings(r, "backward_ops");
  for_each_element(r, "timings", [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) {
      PlanOpTiming t;
      t.strand = read_enum(o, "strand", kPassNames, Pass::kForward);
      t.op = o.string("op", Need::kRequired).value_or("");
      t.start_us = time_field(o, "start_us");
      t.finish_us = time_field(o, "finish_us");
      if (t.finish_us < t.start_us) {
        o.report("finish_us", fmt::format("{}", t.finish_us),
                 fmt::format("must not be before start_us = {}", t.start_us));
      }
      block.timings.push_back(t);
    });
  });
  return block;
}

std::vector<PlanBlock> read_blocks(ObjectReader& r, const std::string& key) {
  std::vector<PlanBlock> blocks;
  for_each_element(r, key, [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) { blocks.push_back(read_block(o)); });
  });
  return blocks;
}

PlanPairing read_pairing(ObjectReader& r) {
  PlanPairing p;
  p.forward_ops = read_ops(r, "forward_ops");
  p.backward_ops = read_ops(r, "backward_ops");
  p.scope = read_enum(r, "scope", kPairingScopeNames, PairingScope::kLayer);
  p.chunk_layers = bounded_field(r, "chunk_layers", kLayerCount);
  p.layer_scope_us = time_field(r, "layer_scope_us");
  p.chunk_scope_us = time_field(r, "chunk_scope_us");
  p.window_layers = bounded_field(r, "window_layers", kLayerCount);
  p.sequential_us = time_field(r, "sequential_us");
  p.layer_pair_us = time_field(r, "layer_pair_us");
  p.layer_blocks = read_blocks(r, "layer_blocks");
  p.window_blocks = read_blocks(r, "window_blocks");
  p.remainder_blocks = read_blocks(r, "remainder_blocks");
  p.layer_segment_bound = r.integer("layer_segment_bound", Need::kOptional, {.min = 1}).value_or(0);
  p.window_segment_bound =
      r.integer("window_segment_bound", Need::kOptional, {.min = 1}).value_or(0);
  return p;
}

PlanLayerRange read_range(ObjectReader& r) {
  return {.first = bounded_field(r, "first", kLayerIndex),
          .count = bounded_field(r, "count", kLayerIndex)};
}

// A task's forward or backward part: an object or null (anything else is reported by the
// ObjectReader as "expected an object").
std::optional<PlanTaskPart> read_part(ObjectReader& r, const std::string& key) {
  const Json* value = r.raw(key, Need::kRequired);
  if (value == nullptr || value->is_null()) return std::nullopt;
  PlanTaskPart part;
  with_element(r, *value, r.pointer_of(key), [&](ObjectReader& o) {
    part.micro_batch = bounded_field(o, "micro_batch", kMicroBatchIndex);
    part.chunk = read_enum(o, "chunk", kChunkSideNames, ChunkSide::kWhole);
    with_object(o, "layers", [&](ObjectReader& l) { part.layers = read_range(l); });
    // Since 1.3.0; absent: the whole backward (read_task refuses it where it does not belong).
    if (const std::optional<std::string> work =
            o.string("work", Need::kOptional, kBackwardShareNames.all())) {
      part.work = kBackwardShareNames.parse(*work).value_or(BackwardShare::kWhole);
    }
    // Since 1.5.0, interleaved stages only (check_model_chunks bounds it by the stage's).
    part.model_chunk =
        o.integer("model_chunk", Need::kOptional, {.min = 0, .max = kLayerIndex.max});
  });
  return part;
}

// Only a lone backward task's backward part may be split (I or W): a forward has no weight
// gradient to defer, and an SI block's backward is co-executed whole (the pairing's blocks
// hold every backward op).
void check_split(ObjectReader& r, const PlanTask& t) {
  const auto refuse = [&](const char* key, const PlanTaskPart& part, const std::string& rule) {
    r.problems().add(r.file(), r.pointer_of(key) + "/work",
                     fmt::format("\"{}\"", backward_share_name(part.work)), rule);
  };
  if (t.forward && t.forward->work != BackwardShare::kWhole) {
    refuse("forward", *t.forward, "a forward part runs whole; only a backward part may be split");
  }
  if (t.backward && t.backward->work != BackwardShare::kWhole && t.kind != TaskKind::kBackward) {
    refuse("backward", *t.backward,
           fmt::format("only a task of kind backward may split its backward (input / weight); "
                       "this task is {}, whose backward runs whole",
                       task_kind_name(t.kind)));
  }
}

PlanTask read_task(ObjectReader& r) {
  PlanTask t;
  t.index = bounded_field(r, "index", kTaskIndex);
  t.kind = read_enum(r, "kind", kTaskKindNames, TaskKind::kForward);
  t.label = r.string("label", Need::kRequired).value_or("");
  t.forward = read_part(r, "forward");
  t.backward = read_part(r, "backward");
  check_split(r, t);
  t.head_loss_micro_batch =
      r.integer("head_loss_micro_batch", Need::kRequired, {.min = -1, .max = kMicroBatchIndex.max})
          .value_or(-1);
  t.start_us = time_field(r, "start_us");
  t.end_us = time_field(r, "end_us");
  for_each_element(r, "waits_for", [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) {
      t.waits_for.push_back({.stage = bounded_field(o, "stage", kStageIndex),
                             .task = bounded_field(o, "task", kTaskIndex)});
    });
  });
  return t;
}

StreamClass read_comm_stream(ObjectReader& r, const std::string& key) {
  const std::vector<std::string> allowed = {stream_class_name(StreamClass::kLocalComm),
                                            stream_class_name(StreamClass::kCrossComm)};
  const std::optional<std::string> text = r.string(key, Need::kRequired, allowed);
  return text ? kStreamClassNames.parse(*text).value_or(StreamClass::kCrossComm)
              : StreamClass::kCrossComm;
}

PlanStagePhases read_phases(ObjectReader& r) {
  return {.p2p_us = time_field(r, "p2p_us"),
          .p2p_stream = read_comm_stream(r, "p2p_stream"),
          .dp_reduce_hidden_us = time_field(r, "dp_reduce_hidden_us"),
          .dp_reduce_exposed_us = time_field(r, "dp_reduce_exposed_us"),
          .dp_gather_hidden_us = time_field(r, "dp_gather_hidden_us"),
          .dp_gather_exposed_us = time_field(r, "dp_gather_exposed_us"),
          .dp_stream = read_comm_stream(r, "dp_stream"),
          .optimizer_us = time_field(r, "optimizer_us")};
}

// A part names a model chunk exactly when its stage has model chunks, one it has, whose
// layers are the part's.
void check_model_chunks(ObjectReader& r, const PlanStage& s) {
  const int64_t chunks = static_cast<int64_t>(s.model_chunks.size());
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    const PlanTask& task = s.tasks[t];
    for (const auto& [key, part] :
         {std::pair{"forward", &task.forward}, std::pair{"backward", &task.backward}}) {
      if (!*part || task.kind == TaskKind::kHeadLoss) continue;
      const std::string pointer = r.pointer_of("tasks") + fmt::format("/{}/{}/model_chunk", t, key);
      const std::optional<int64_t> c = (*part)->model_chunk;
      if (chunks == 0 && c) {
        r.problems().add(r.file(), pointer, std::to_string(*c),
                         "names a model chunk, but the stage has no model_chunks (only "
                         "interleaved stages have them)");
      } else if (chunks > 0 && !c) {
        r.problems().add(r.file(), pointer, "(absent)",
                         fmt::format("must name one of the stage's {} model_chunks", chunks));
      } else if (c && *c >= chunks) {
        r.problems().add(r.file(), pointer, std::to_string(*c),
                         fmt::format("must name one of the stage's {} model_chunks (0..{})", chunks,
                                     chunks - 1));
      } else if (c) {
        const PlanLayerRange& want = s.model_chunks[static_cast<size_t>(*c)];
        const PlanLayerRange& got = (*part)->layers;
        if (want.first != got.first || want.count != got.count) {
          r.problems().add(r.file(), pointer, std::to_string(*c),
                           fmt::format("names model chunk {}, layers {}..{}, but the part runs "
                                       "layers {}..{}",
                                       *c, want.first, want.first + want.count - 1, got.first,
                                       got.first + got.count - 1));
        }
      }
    }
  }
}

PlanStage read_stage(ObjectReader& r) {
  PlanStage s;
  s.stage = bounded_field(r, "stage", kStageIndex);
  s.ranks = read_integers(r, "ranks", kRankIndex.max);
  s.shape_rank = bounded_field(r, "shape_rank", kRankIndex);
  s.pairing = count_field(r, "pairing");
  with_object(r, "down_layers", [&](ObjectReader& o) { s.down_layers = read_range(o); });
  with_object(r, "up_layers", [&](ObjectReader& o) { s.up_layers = read_range(o); });
  // Since 1.5.0: interleaved stages' model chunks.
  if (r.raw("model_chunks", Need::kOptional) != nullptr) {
    for_each_element(r, "model_chunks", [&](const Json& e, const std::string& pointer) {
      with_element(r, e, pointer,
                   [&](ObjectReader& o) { s.model_chunks.push_back(read_range(o)); });
    });
  }
  s.embedding = r.boolean("embedding", Need::kRequired).value_or(false);
  s.head_loss = r.boolean("head_loss", Need::kRequired).value_or(false);
  for_each_element(r, "tasks", [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) { s.tasks.push_back(read_task(o)); });
  });
  check_model_chunks(r, s);
  // Plans before 1.1.0 lack it.
  if (std::optional<ObjectReader> phases = r.object("phases", Need::kOptional)) {
    s.phases = read_phases(*phases);
    phases->finish();
  }
  return s;
}

PlanShapeChoice read_shape_choice(ObjectReader& r) {
  PlanShapeChoice c;
  c.requested = read_enum(r, "requested", kShapeRequestNames, ShapeRequest::kAuto);
  c.chosen = read_enum(r, "chosen", kPipelineShapeNames, PipelineShape::kW);
  c.reason = r.string("reason", Need::kRequired).value_or("");
  for_each_element(r, "candidates", [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) {
      PlanShapeCandidate k;
      k.shape = read_enum(o, "shape", kPipelineShapeNames, PipelineShape::kW);
      k.split_backward = o.boolean("split_backward", Need::kRequired).value_or(false);
      k.max_deferred_weight_gradients =
          o.integer("max_deferred_weight_gradients", Need::kRequired, {.min = -1}).value_or(0);
      k.si_blocks = o.boolean("si_blocks", Need::kOptional).value_or(false);  // since 1.5.0
      k.iteration_us = time_field(o, "iteration_us");
      k.bubble_ratio = o.real("bubble_ratio", Need::kRequired, {.min = 0, .max = 1}).value_or(0);
      k.peak_bytes = count_field(o, "peak_bytes");
      k.fits = o.boolean("fits", Need::kRequired).value_or(false);
      c.candidates.push_back(k);
    });
  });
  return c;
}

PlanScheme read_scheme(ObjectReader& r) {
  PlanScheme s;
  s.scheme = read_enum(r, "scheme", kPipelineSchemeNames, PipelineScheme::kDHelix);
  s.shape = read_enum(r, "shape", kPipelineShapeNames, PipelineShape::kW);
  // Absent from 1.0.0 plans: their shapes were w (2 chunks) and 1f1b (1).
  s.chunks_per_stage = r.integer("chunks_per_stage", Need::kOptional, kLayerCount)
                           .value_or(s.shape == PipelineShape::kW ? 2 : 1);
  s.iteration_us = time_field(r, "iteration_us");
  s.bubble_ratio = r.real("bubble_ratio", Need::kRequired, {.min = 0, .max = 1}).value_or(0);
  s.tokens_per_second = time_field(r, "tokens_per_second");
  s.tflops_per_gpu = time_field(r, "tflops_per_gpu");
  s.mfu = time_field(r, "mfu");
  s.speedup_vs_megatron = time_field(r, "speedup_vs_megatron");
  with_object(r, "comm", [&](ObjectReader& c) {
    for (ParallelDim type : kParallelDimNames.values()) {
      with_object(c, parallel_dim_name(type), [&](ObjectReader& o) {
        s.comm.push_back({.type = type,
                          .hidden_us = time_field(o, "hidden_us"),
                          .exposed_us = time_field(o, "exposed_us")});
      });
    }
  });
  s.p2p_transfers = count_field(r, "p2p_transfers");
  s.p2p_bytes = count_field(r, "p2p_bytes");
  s.fits = r.boolean("fits", Need::kRequired).value_or(false);
  for_each_element(r, "memory", [&](const Json& e, const std::string& pointer) {
    with_element(r, e, pointer, [&](ObjectReader& o) {
      PlanStageMemory m;
      m.stage = bounded_field(o, "stage", kStageIndex);
      m.weight_bytes = count_field(o, "weight_bytes");
      m.gradient_bytes = count_field(o, "gradient_bytes");
      m.optimizer_bytes = count_field(o, "optimizer_bytes");
      m.activation_bytes = count_field(o, "activation_bytes");
      m.total_bytes = count_field(o, "total_bytes");
      s.memory.push_back(m);
    });
  });
  return s;
}

// Cross-field rules the schema cannot state.
void check_references(const Plan& plan, const std::string& file, ProblemList& problems) {
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const PlanStage& stage = plan.stages[i];
    if (stage.pairing >= static_cast<int64_t>(plan.pairings.size())) {
      problems.add(file, fmt::format("/stages/{}/pairing", i), std::to_string(stage.pairing),
                   fmt::format("must name one of the {} pairings", plan.pairings.size()));
    }
    for (size_t t = 0; t < stage.tasks.size(); ++t) {
      for (size_t w = 0; w < stage.tasks[t].waits_for.size(); ++w) {
        const PlanTaskRef& ref = stage.tasks[t].waits_for[w];
        const bool valid = ref.stage < static_cast<int64_t>(plan.stages.size()) &&
                           ref.task < static_cast<int64_t>(
                                          plan.stages[static_cast<size_t>(ref.stage)].tasks.size());
        if (!valid) {
          problems.add(file, fmt::format("/stages/{}/tasks/{}/waits_for/{}", i, t, w),
                       fmt::format("stage {} task {}", ref.stage, ref.task),
                       "names no task of the plan");
        }
      }
    }
  }
}

}  // namespace

Plan plan_from_json(const Json& json, const std::string& file) {
  ProblemList problems;
  ObjectReader root(json, file, "", problems);
  Plan plan;
  check_schema_version(root, kPlanSchemaMajor);
  plan.schema_version = root.string("schema_version", Need::kRequired).value_or("");
  plan.meta = read_opaque_object(root, "meta");
  with_object(root, "inputs", [&](ObjectReader& o) {
    with_object(o, "model", [&](ObjectReader& m) { plan.inputs.model = read_ref(m, "name"); });
    plan.inputs.parallel = read_opaque_object(o, "parallel");
    with_object(o, "cluster", [&](ObjectReader& c) { plan.inputs.cluster = read_ref(c, "name"); });
    with_object(o, "profile",
                [&](ObjectReader& p) { plan.inputs.profile = read_ref(p, "backend"); });
  });
  with_object(root, "job", [&](ObjectReader& o) {
    plan.job.name = o.string("name", Need::kRequired).value_or("");
    plan.job.model = read_opaque_object(o, "model");
    plan.job.cluster = read_opaque_object(o, "cluster");
    plan.job.parallel = read_opaque_object(o, "parallel");
  });
  with_object(root, "options", [&](ObjectReader& o) {
    plan.options.allow_oom = o.boolean("allow_oom", Need::kRequired).value_or(false);
    plan.options.distributed_optimizer =
        o.boolean("distributed_optimizer", Need::kRequired).value_or(true);
    plan.options.cross_layer_max_segment_ops =
        o.integer("cross_layer_max_segment_ops", Need::kRequired, kCount).value_or(0);
    // Since 1.4.0, only with use_megatron_fsdp.
    if (o.raw("fsdp", Need::kOptional) == nullptr) return;
    PlanFsdpRecord fsdp;
    with_object(o, "fsdp", [&](ObjectReader& f) {
      if (auto name =
              f.string("sharding_strategy", Need::kRequired, kFsdpShardingStrategyNames.all()))
        fsdp.sharding_strategy = *kFsdpShardingStrategyNames.parse(*name);
      fsdp.reshard_after_forward =
          f.boolean("reshard_after_forward", Need::kRequired).value_or(true);
    });
    plan.options.fsdp = fsdp;
  });
  plan.num_micro_batches =
      root.integer("num_micro_batches", Need::kRequired, kMicroBatchCount).value_or(1);
  for_each_element(root, "pairings", [&](const Json& e, const std::string& pointer) {
    with_element(root, e, pointer,
                 [&](ObjectReader& o) { plan.pairings.push_back(read_pairing(o)); });
  });
  for_each_element(root, "stages", [&](const Json& e, const std::string& pointer) {
    with_element(root, e, pointer, [&](ObjectReader& o) { plan.stages.push_back(read_stage(o)); });
  });
  with_object(root, "memory_budget", [&](ObjectReader& o) {
    plan.memory_budget.gpu = o.string("gpu", Need::kRequired).value_or("");
    plan.memory_budget.capacity_bytes = count_field(o, "capacity_bytes");
    plan.memory_budget.reserve_bytes = count_field(o, "reserve_bytes");
    plan.memory_budget.usable_bytes = o.integer("usable_bytes", Need::kRequired).value_or(0);
  });
  for_each_element(root, "schemes", [&](const Json& e, const std::string& pointer) {
    with_element(root, e, pointer,
                 [&](ObjectReader& o) { plan.schemes.push_back(read_scheme(o)); });
  });
  // Plans before 1.3.0 lack it.
  if (std::optional<ObjectReader> choice = root.object("shape_choice", Need::kOptional)) {
    plan.shape_choice = read_shape_choice(*choice);
    choice->finish();
  }
  root.finish();
  if (problems.empty()) check_references(plan, file, problems);
  problems.throw_if_any();
  return plan;
}

namespace {

// The plan's recorded input hashes must be those of its own copy of the job: a plan whose
// /job was edited (or whose /inputs were) no longer says what it was made for, and
// dhelix-diff and dhelix-run would trust the wrong half.
void check_inputs_match_job(const Plan& plan, const std::string& file) {
  ProblemList problems;
  auto check = [&](const std::string& pointer, const std::string& recorded,
                   const std::string& actual, const std::string& job_pointer) {
    if (recorded == actual) return;
    problems.add(file, pointer, recorded,
                 fmt::format("does not match the plan's own {} (sha256 {}): the plan was "
                             "edited or corrupted; plan the job again",
                             job_pointer, actual));
  };
  check("/inputs/model/sha256", plan.inputs.model.sha256, sha256_hex(plan.job.model.dump()),
        "/job/model");
  check("/inputs/cluster/sha256", plan.inputs.cluster.sha256, sha256_hex(plan.job.cluster.dump()),
        "/job/cluster");
  if (plan.inputs.parallel.dump() != plan.job.parallel.dump()) {
    problems.add(file, "/inputs/parallel", plan.inputs.parallel.dump(),
                 "differs from the plan's own /job/parallel: the plan was edited or corrupted");
  }
  problems.throw_if_any();
}

}  // namespace

Plan read_plan(const std::string& path) {
  // One read: a FIFO (or a file changing meanwhile) must not be read twice.
  const std::string text = read_json_text(path);
  const Json json = parse_json_text(text, path);
  require_file_kind(json, path, FileKind::kPlan);
  Plan plan = plan_from_json(json, path);
  // Json sorts keys; re-read the opaque blocks in file order so that a plan read and
  // written again keeps its bytes.
  const OrderedJson ordered = OrderedJson::parse(text);
  plan.meta = ordered.at("meta");
  plan.inputs.parallel = ordered.at("inputs").at("parallel");
  plan.job.model = ordered.at("job").at("model");
  plan.job.cluster = ordered.at("job").at("cluster");
  plan.job.parallel = ordered.at("job").at("parallel");
  check_inputs_match_job(plan, path);
  return plan;
}

}  // namespace dhelix
