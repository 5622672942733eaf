// The device path's MoE layer (runtime/model/moe_layers_padded.h) on values: no GPU runs in
// CI, so PaddedMoeLayers runs here on the host (PaddedCpuBackend: the CPU backend plus the
// CUDA MoE kernels' fp32 twin, runtime/cpu/moe_padded_cpu.h) for every rank of one EP x TP
// group, and its outputs and gradients are compared with the CPU runtime's MoeLayersCpu,
// whose layer the other MoE tests check end to end.
//
//   the group   the ranks reachable from rank 0 through TP and EP groups (placement.h)
//   the ops     one layer's MoE ops in the planner's own order: the layer's forward and
//               backward DAGs (lib/dag_builder_moe.cc, with recompute's repeats from
//               with_recompute) topologically sorted, kept where MoeLayersCpu binds the op
//               (so an op the padded layer lacks fails the test), plus bwd.ln_mlp, where the
//               runtime sums the input gradients (sum_input_gradient). Every op is bound on
//               every rank first, as the interpreter binds a program, then run in lockstep.
//   collectives the device's semantics (runtime/cuda/nccl_communicator.h), over the group
//               the op names (Op::group): all_to_all_v in equal blocks of count / size,
//               block j of member i to block i of member j, the counts beside them;
//               all_gather in member order; reduce_scatter and all_reduce summed in
//               member order. before_collective and after_collective run around them.
//   reference   one MoeLayersCpu with every parallel degree 1 and a sequence of the rows N
//               a rank of the group has, run on micro-batch r with rank r's inputs (r the
//               rank's index in the group): its y and dx are rank r's; its weight gradients,
//               accumulated over the micro-batches, are the sums over the ranks of the
//               padded layers' gradients, each rank's slice mapped into the full tensors
//               (experts [j L, (j + 1) L) on EP rank j; expert TP and TP slices as
//               moe_layers_cpu.cc cuts them); its aux loss and dropped copies the sums.
//
// Tolerance: 1e-5 relative L2 (||a - b|| / ||b|| over a tensor). Both sides are fp32 and
// route identically (the router's logits come from the same GEMM call on the same rows, so
// the chosen experts, kept sets and capacity blocks are the same bits); what differs is
// the order of sums: the expert GEMMs run on ep C rows per expert (zero padding included)
// instead of the kept rows, and an expert's weight gradient sums its EP sources' rows in
// one GEMM where the reference accumulates one micro-batch at a time. Each such sum has at
// most a few hundred terms (T k copies), so rounding moves a result by a few hundred ulps
// in the worst case and by about sqrt(n) ulps (~1e-6 relative) typically (measured here:
// 5e-8 to 3e-7); a wrong row, block or count moves whole rows, far above 1e-5 (swapping
// any of the three regroup directions fails the cases with 8 experts by ~1, see kCases;
// leaving out the load-balancing loss's gradient fails the router's by ~4e-3).
//
// Cases: a TEST_P over MoeCase (parallel setting and model tweaks): EP, dropless routing,
// TP with expert TP 1 and 2, CP, full and selective recompute, a shared expert. The same
// harness also runs MoeLayersCpu in the tested layer's place (MoeHarnessSelfCheck, with the
// host's all_to_all_v), which checks the harness itself.

#include "runtime/model/moe_layers_padded.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/cluster_reader.h"
#include "lib/dag_builder.h"
#include "lib/error.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "lib/placement.h"
#include "lib/rank_shape.h"
#include "runtime/model/moe_layers_cpu.h"
#include "tests/runtime/padded_cpu_backend.h"
#include "tests/runtime/simulated_device_collectives.h"

namespace dhelix::rt {
namespace {

using test::PaddedCpuBackend;
using test::simulate_collective;
using PaddedLayers = PaddedMoeLayers<PaddedCpuBackend>;
static_assert(std::is_same_v<MoeLayersOf<PaddedCpuBackend>::type, PaddedLayers>);

constexpr int64_t kLayer = 1;  // any layer: the DAG is every layer's
constexpr uint64_t kSeed = 29;
constexpr double kTolerance = 1e-5;  // relative L2; see the file comment

/// One parallel setting and the model's tweaks.
struct MoeCase {
  std::string name;
  int64_t dp = 1, tp = 1, cp = 1, ep = 1;
  int64_t expert_tp = 0;  ///< 0: tp (Megatron-Core's default)
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  int64_t experts = 4;           ///< the model's 4, or more
  double capacity_factor = 1.0;  ///< the model's 1.0 drops copies of an unbalanced routing
  int64_t shared_ffn = 0;        ///< a shared expert's FFN width (0: none)
  bool drops = true;             ///< the routing must drop copies (false: it may drop none)
};

// gtest names a case by it in failures.
void PrintTo(const MoeCase& c, std::ostream* out) { *out << c.name; }

std::string source(const std::string& path) { return std::string(DHELIX_SOURCE_DIR) + "/" + path; }

// examples/models/llama-tiny-moe.json (hidden 64, top-2, FFN 64) on the CPU host cluster,
// micro-batches of 2 sequences of 32 tokens: N = 64 / (cp tp) rows per rank.
JobSpec job_of(const MoeCase& c) {
  JobSpec job;
  job.name = "moe-padded-" + c.name;
  job.source_file = "<test>";
  job.model = read_model_file(source("examples/models/llama-tiny-moe.json"));
  job.cluster = read_cluster(source("examples/clusters/cpu-host.json"));
  MoeSpec& moe = *job.model.moe;
  moe.num_experts = c.experts;
  moe.capacity_factor = c.capacity_factor;
  moe.shared_expert_ffn_hidden_size = c.shared_ffn;
  ParallelSpec& p = job.parallel;
  p.dp = c.dp;
  p.tp = c.tp;
  p.sp = c.tp > 1;  // the planner's rule for MoE under TP
  p.cp = c.cp;
  p.ep = c.ep;
  p.expert_tp = c.expert_tp;
  p.micro_batch_size = 2;
  p.global_batch_size = 2 * c.dp;
  p.seq_length = 32;
  p.recompute.granularity = c.recompute;
  return job;
}

// The same model with every parallel degree 1, its micro-batch of `rows` rows.
JobSpec reference_job(const JobSpec& job, int64_t rows) {
  JobSpec ref = job;
  ref.name += "-reference";
  ref.parallel = ParallelSpec{};
  ref.parallel.micro_batch_size = rows % 2 == 0 ? 2 : 1;
  ref.parallel.seq_length = rows / ref.parallel.micro_batch_size;
  ref.parallel.global_batch_size = ref.parallel.micro_batch_size;
  return ref;
}

/// The ranks reachable from rank 0 through TP and EP groups, ascending.
std::vector<int64_t> moe_group(const JobSpec& job) {
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  std::set<int64_t> ranks = {0};
  for (bool grew = true; grew;) {
    grew = false;
    for (int64_t rank : std::vector<int64_t>(ranks.begin(), ranks.end())) {
      for (ParallelDim dim : {ParallelDim::kTp, ParallelDim::kEp}) {
        for (int64_t member : placement.group(dim, rank).ranks) grew |= ranks.insert(member).second;
      }
    }
  }
  return {ranks.begin(), ranks.end()};
}

/// One op of the MoE MLP in the plan's order.
struct PlannedOp {
  std::string id;
  bool collective = false;
  ParallelDim group = ParallelDim::kTp;
  int64_t group_size = 1;
};

// The op the MoE layers bind for a DAG id: bwd.recompute.X repeats fwd.X.
std::string bound_name(const std::string& id) {
  const std::string repeat = "bwd.recompute.";
  return id.starts_with(repeat) ? "fwd." + id.substr(repeat.size()) : id;
}

std::vector<PlannedOp> moe_ops(const JobSpec& job, int64_t rank) {
  const LayerDags dags =
      with_recompute(build_layer_dags(job, rank), job.parallel.recompute.granularity);
  std::vector<PlannedOp> ops;
  for (const LayerDag* dag : {&dags.forward, &dags.backward}) {
    for (int64_t v : dag->topological_order()) {
      const Op& op = dag->op(v);
      const std::string name = bound_name(op.id);
      if (!MoeLayersCpu::handles(name) && name != "bwd.ln_mlp") continue;
      ops.push_back({op.id, is_communication(op.kind), op.group, op.group_size});
    }
  }
  return ops;
}

std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> pick(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = pick(engine);
  return values;
}

double relative_l2(const float* a, const float* b, int64_t count) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

/// One layer's inputs and outputs on one rank (or one micro-batch of the reference). With
/// recompute the repeats and the backward read x_again (what the repeated ln_mlp writes:
/// x's values) and write y_again, as the stage model's recompute state does.
struct LayerBuffers {
  std::vector<float> x, x_again, dy, y, y_again, dx;
  LayerBuffers(int64_t elements, uint32_t seed)
      : x(random_values(elements, seed)),
        x_again(x),
        dy(random_values(elements, seed + 1000)),
        y(x.size(), 0.0f),
        y_again(x.size(), 0.0f),
        dx(x.size(), 0.0f) {}
  template <class Io>
  Io io(bool recomputing) {
    return Io{.x = recomputing ? x_again.data() : x.data(),
              .y = recomputing ? y_again.data() : y.data(),
              .dy = dy.data(),
              .dx = dx.data()};
  }
};

// Binds `id` of (micro_batch, kLayer) as the stage model does (stage_model_impl.h's
// bind_moe): with recompute the repeats and every backward op read the second buffers,
// and the MoE layer's own second set only under full recompute.
template <class B, class Layers, class Io>
BasicBoundOp<B> bind_moe_op(Layers& layers, const std::string& id, int64_t micro_batch,
                            LayerBuffers& buffers, RecomputeGranularity recompute) {
  const std::string op = bound_name(id);
  const bool recomputing =
      recompute != RecomputeGranularity::kNone && (id != op || !op.starts_with("fwd."));
  const bool moe_recomputing = recomputing && recompute == RecomputeGranularity::kFull;
  const Io io = buffers.io<Io>(recomputing);
  if (op == "bwd.ln_mlp") {
    BasicBoundOp<B> sum;
    sum.compute = layers.sum_input_gradient(kLayer, micro_batch, io, moe_recomputing);
    return sum;
  }
  std::optional<BasicBoundOp<B>> bound = layers.bind(op, kLayer, micro_batch, io, moe_recomputing);
  if (!bound) throw Error(ErrorCode::kInternal, "the layer does not bind " + id);
  return std::move(*bound);
}

// ---- the group of padded layers ----

// One rank's MoE layers on backend B (MoeLayersOf<B>: PaddedMoeLayers on
// PaddedCpuBackend; MoeLayersCpu on CpuBackend for the harness's own check).
template <class B>
struct GroupRank {
  using Layers = typename MoeLayersOf<B>::type;
  int64_t rank = 0;
  typename B::Memory memory;  // declared before the layers, which use it
  std::unique_ptr<Layers> layers;
  std::unique_ptr<LayerBuffers> buffers;
  std::vector<BasicBoundOp<B>> bound;  // per planned op
};
template <class B>
using GroupRanks = std::vector<std::unique_ptr<GroupRank<B>>>;

// The all_to_all_v each backend's layers are written for: the CPU's packed blocks, the
// device's padded ones.
template <class B>
constexpr test::AllToAll kAllToAllOf =
    std::is_same_v<B, CpuBackend> ? test::AllToAll::kHostPacked : test::AllToAll::kDevicePadded;

// Binds every op on every rank, then runs them in lockstep; returns the collectives run.
template <class B>
std::map<CollectiveKind, int64_t> run_group(const JobSpec& job, const std::vector<PlannedOp>& ops,
                                            GroupRanks<B>& ranks) {
  const RecomputeGranularity recompute = job.parallel.recompute.granularity;
  std::map<int64_t, GroupRank<B>*> by_rank;
  for (auto& r : ranks) {
    by_rank[r->rank] = r.get();
    for (const PlannedOp& op : ops) {
      r->bound.push_back(bind_moe_op<B, typename GroupRank<B>::Layers, typename MoeLayersOf<B>::Io>(
          *r->layers, op.id, /*micro_batch=*/0, *r->buffers, recompute));
    }
  }
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  const typename B::Exec exec;
  std::map<CollectiveKind, int64_t> collectives;
  for (size_t i = 0; i < ops.size(); ++i) {
    SCOPED_TRACE(ops[i].id);
    const PlannedOp& op = ops[i];
    if (!op.collective) {
      for (auto& r : ranks) {
        EXPECT_FALSE(r->bound[i].collective.has_value());
        r->bound[i].compute(exec);
      }
      continue;
    }
    for (auto& r : ranks) {
      EXPECT_TRUE(r->bound[i].collective.has_value());
      if (!r->bound[i].collective) return collectives;
      if (r->bound[i].before_collective) r->bound[i].before_collective(exec);
    }
    std::set<int64_t> done;
    for (auto& r : ranks) {
      if (done.contains(r->rank)) continue;
      const ProcessGroup group = placement.group(op.group, r->rank);
      EXPECT_EQ(static_cast<int64_t>(group.ranks.size()), op.group_size);
      std::vector<const CollectiveRequest*> members;
      for (int64_t member : group.ranks) {
        EXPECT_TRUE(by_rank.contains(member)) << "rank " << member << " outside the group";
        if (!by_rank.contains(member)) return collectives;
        members.push_back(&*by_rank[member]->bound[i].collective);
        done.insert(member);
      }
      simulate_collective(members, kAllToAllOf<B>);
      ++collectives[members.front()->kind];
    }
    for (auto& r : ranks) {
      if (r->bound[i].after_collective) r->bound[i].after_collective(exec);
    }
  }
  return collectives;
}

// ---- comparing the weights and their gradients ----

// Where element i of a rank's slice of `name` ("layers.<l>.router", ...) sits in the full
// tensor of the reference (every expert, every column), as moe_layers_cpu.cc cuts them:
// local expert e is expert first + e; under expert TP the rank holds fc1's gate rows
// [etp_rank f, +f) and up rows F + the same, fc2's columns [etp_rank f, +f); the shared
// expert's fc1 and fc2 are TP slices the same way, its gate replicated.
struct SliceGeometry {
  int64_t h = 0, full_f = 0, f = 0, etp_rank = 0, first_expert = 0;
  int64_t full_fs = 0, fs = 0, tp_rank = 0;
};

SliceGeometry slice_geometry(const JobSpec& job, int64_t rank) {
  const RankShape dims = rank_shape(job, rank);
  const MoeSpec& moe = *job.model.moe;
  const int64_t etp = job.parallel.expert_tp_size();
  const int64_t local = moe.num_experts / job.parallel.ep;
  const int64_t ep_rank = Placement(job.parallel, job.cluster.gpus_per_node).coordinates(rank).ep;
  return {.h = dims.hidden,
          .full_f = moe.expert_ffn_hidden_size,
          .f = moe.expert_ffn_hidden_size / etp,
          .etp_rank = etp > 1 ? dims.tp_rank : 0,
          .first_expert = ep_rank * local,
          .full_fs = moe.shared_expert_ffn_hidden_size,
          .fs = moe.shared_expert_ffn_hidden_size / dims.tp,
          .tp_rank = dims.tp_rank};
}

int64_t full_index(const std::string& name, const SliceGeometry& g, int64_t i) {
  const std::string kind = name.substr(name.find('.', name.find('.') + 1) + 1);
  const int64_t h = g.h;
  if (kind == "router" || kind == "shared_gate") return i;
  if (kind == "experts_fc1") {  // [L, 2f, h]
    const int64_t e = i / (2 * g.f * h), r = (i / h) % (2 * g.f), c = i % h;
    const int64_t row = r < g.f ? g.etp_rank * g.f + r : g.full_f + g.etp_rank * g.f + (r - g.f);
    return ((g.first_expert + e) * 2 * g.full_f + row) * h + c;
  }
  if (kind == "experts_fc2") {  // [L, h, f]
    const int64_t e = i / (h * g.f), r = (i / g.f) % h, c = i % g.f;
    return ((g.first_expert + e) * h + r) * g.full_f + g.etp_rank * g.f + c;
  }
  const int64_t r0 = g.tp_rank * g.fs;
  if (kind == "shared_fc1") {  // [2fs, h]
    const int64_t r = i / h, c = i % h;
    return (r < g.fs ? r0 + r : g.full_fs + r0 + (r - g.fs)) * h + c;
  }
  if (kind == "shared_fc2") {  // [h, fs]
    return (i / g.fs) * g.full_fs + r0 + i % g.fs;
  }
  throw Error(ErrorCode::kInternal, "no slice geometry for " + name);
}

// Every reference parameter: the padded ranks' initial values are its values (bit for
// bit), their slices cover it, and the sum of their gradients is its gradient.
template <class B>
void compare_parameters(const JobSpec& job, GroupRanks<B>& ranks, MoeLayersCpu& reference) {
  const std::vector<ParameterView> expected = reference.parameters(kLayer);
  for (auto& r : ranks) {
    for (const auto& view : r->layers->parameters(kLayer)) {
      EXPECT_TRUE(std::ranges::any_of(expected, [&](const auto& e) { return e.name == view.name; }))
          << "rank " << r->rank << " has " << view.name << ", the CPU layer has not";
    }
  }
  for (const ParameterView& want : expected) {
    SCOPED_TRACE(want.name);
    std::vector<float> sum(static_cast<size_t>(want.count), 0.0f);
    std::vector<int64_t> holders(sum.size(), 0);
    int64_t value_mismatches = 0;
    for (auto& r : ranks) {  // rank order, as a reduction over the group sums
      const SliceGeometry geometry = slice_geometry(job, r->rank);
      for (const auto& view : r->layers->parameters(kLayer)) {
        if (view.name != want.name) continue;
        for (int64_t i = 0; i < view.count; ++i) {
          const int64_t at = full_index(view.name, geometry, i);
          ASSERT_TRUE(at >= 0 && at < want.count) << "rank " << r->rank << " element " << i;
          value_mismatches += view.values[i] == want.values[at] ? 0 : 1;
          sum[static_cast<size_t>(at)] += view.gradient[i];
          ++holders[static_cast<size_t>(at)];
        }
      }
    }
    EXPECT_EQ(value_mismatches, 0) << "initial values differ from the CPU layer's";
    EXPECT_EQ(std::ranges::count(holders, 0), 0) << "elements no rank holds";
    EXPECT_LE(relative_l2(sum.data(), want.gradient, want.count), kTolerance) << "gradient";
  }
}

// ---- the test ----

// The whole check for one case, with the MoE layers of backend B on every rank.
template <class B>
void check_group_against_reference(const MoeCase& c) {
  const JobSpec job = job_of(c);
  const ProblemList problems = validate_job(job);
  ASSERT_TRUE(problems.empty()) << problems.problems().front().to_string();
  const std::vector<int64_t> group = moe_group(job);
  ASSERT_EQ(static_cast<int64_t>(group.size()), c.tp * c.ep) << "one EP x TP group";
  const int64_t rows = rank_shape(job, 0).rows, h = job.model.hidden_size;
  // A large weight for the load-balancing loss (aux_dloss = loss_scale T = T), so that its
  // share of the router's gradient lies far above the tolerance.
  const float loss_scale = 1.0f;

  // The layers of every rank, each with its own random x and dy.
  GroupRanks<B> ranks;
  for (size_t index = 0; index < group.size(); ++index) {
    auto r = std::make_unique<GroupRank<B>>();
    r->rank = group[index];
    ASSERT_EQ(rank_shape(job, r->rank).rows, rows);
    r->layers = MoeLayersOf<B>::make(job, r->rank, std::vector<int64_t>{kLayer}, kSeed, &loss_scale,
                                     r->memory);
    r->buffers = std::make_unique<LayerBuffers>(rows * h, static_cast<uint32_t>(100 + index));
    ranks.push_back(std::move(r));
  }
  const std::vector<PlannedOp> ops = moe_ops(job, 0);
  for (int64_t rank : group) {
    const std::vector<PlannedOp> own = moe_ops(job, rank);
    ASSERT_EQ(own.size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i) ASSERT_EQ(own[i].id, ops[i].id) << "rank " << rank;
  }
  const std::map<CollectiveKind, int64_t> collectives = run_group<B>(job, ops, ranks);
  if (c.ep > 1) {  // dispatch and combine, forward and backward, at least
    EXPECT_GE(collectives.contains(CollectiveKind::kAllToAllV)
                  ? collectives.at(CollectiveKind::kAllToAllV)
                  : 0,
              4);
  }

  // The reference: micro-batch r is rank r's (group order).
  const JobSpec ref_job = reference_job(job, rows);
  ASSERT_EQ(rank_shape(ref_job, 0).rows, rows);
  MoeLayersCpu reference(ref_job, 0, {kLayer}, kSeed, &loss_scale);
  const std::vector<PlannedOp> ref_ops = moe_ops(ref_job, 0);
  std::vector<std::unique_ptr<LayerBuffers>> ref_buffers;
  for (size_t index = 0; index < group.size(); ++index) {
    const auto mb = static_cast<int64_t>(index);
    ref_buffers.push_back(
        std::make_unique<LayerBuffers>(rows * h, static_cast<uint32_t>(100 + index)));
    std::vector<BoundOp> bound;
    for (const PlannedOp& op : ref_ops) {
      ASSERT_FALSE(op.collective) << op.id;
      bound.push_back(bind_moe_op<CpuBackend, MoeLayersCpu, MoeLayerIo>(
          reference, op.id, mb, *ref_buffers.back(), RecomputeGranularity::kNone));
    }
    for (BoundOp& op : bound) op.compute(CpuBackend::Exec{});
  }

  // Outputs and input gradients, rank by rank.
  float aux = 0.0f;
  int64_t dropped = 0;
  for (size_t index = 0; index < group.size(); ++index) {
    SCOPED_TRACE("rank " + std::to_string(group[index]));
    const LayerBuffers& got = *ranks[index]->buffers;
    const LayerBuffers& want = *ref_buffers[index];
    EXPECT_LE(relative_l2(got.y.data(), want.y.data(), rows * h), kTolerance) << "y";
    EXPECT_LE(relative_l2(got.dx.data(), want.dx.data(), rows * h), kTolerance) << "dx";
    if (c.recompute == RecomputeGranularity::kFull) {
      EXPECT_EQ(got.y_again, got.y) << "the repeated forward's y";
    }
    aux += ranks[index]->layers->aux_loss_sum(1);
    dropped += ranks[index]->layers->dropped_copies();
  }
  compare_parameters<B>(job, ranks, reference);

  // Routing: the same copies dropped and the same load-balancing loss (same logits, same
  // routing: equal up to the order of the sum over ranks).
  const auto micro_batches = static_cast<int64_t>(group.size());
  EXPECT_EQ(dropped, reference.dropped_copies());
  EXPECT_NEAR(aux, reference.aux_loss_sum(micro_batches),
              1e-6 * std::abs(reference.aux_loss_sum(micro_batches)));
  if (c.drops) {
    EXPECT_GT(reference.dropped_copies(), 0) << "the case must drop copies";
  } else {
    EXPECT_EQ(reference.dropped_copies(), 0) << "the case must drop none";
  }
}

// cf 1 drops copies of an unbalanced routing (random x, random router); cf 2 with 4
// experts and top-2 gives C = T, which no routing exceeds. With 8 experts the EP layout's
// L = E / ep differs from ep (4 and 2, 2 and 4), so that the source-major and expert-major
// orders differ: with L = ep (E = 4, ep = 2) the regroup is its own inverse, with L = 1
// the identity, and either would hide a swapped direction.
const MoeCase kCases[] = {
    {.name = "ep_1", .dp = 1, .ep = 1},
    {.name = "ep_1_drops_none", .dp = 1, .ep = 1, .capacity_factor = 2.0, .drops = false},
    {.name = "ep_2", .dp = 2, .ep = 2},
    {.name = "ep_2_drops_none", .dp = 2, .ep = 2, .capacity_factor = 2.0, .drops = false},
    {.name = "experts_8_ep_2", .dp = 2, .ep = 2, .experts = 8},
    {.name = "experts_8_ep_4", .dp = 4, .ep = 4, .experts = 8},
    // Dropless: C = T, every copy kept.
    {.name = "dropless", .dp = 2, .ep = 2, .capacity_factor = 0.0, .drops = false},
    {.name = "tp_2_etp_1", .dp = 2, .tp = 2, .ep = 2, .expert_tp = 1},
    {.name = "tp_2_etp_2", .dp = 2, .tp = 2, .ep = 2, .expert_tp = 2},
    // Expert TP's member-major <-> expert-major regroup with etp != L (etp 2, L 4 and 8).
    {.name = "experts_8_tp_2_etp_2", .dp = 2, .tp = 2, .ep = 2, .expert_tp = 2, .experts = 8},
    {.name = "experts_8_tp_2_etp_2_ep_1", .dp = 2, .tp = 2, .ep = 1, .expert_tp = 2, .experts = 8},
    {.name = "cp_2", .dp = 1, .cp = 2, .ep = 2},
    {.name = "full_recompute", .dp = 2, .ep = 2, .recompute = RecomputeGranularity::kFull},
    {.name = "selective_recompute",
     .dp = 2,
     .ep = 2,
     .recompute = RecomputeGranularity::kSelective},
    {.name = "shared_expert", .dp = 2, .ep = 2, .shared_ffn = 32},
    {.name = "shared_expert_tp_2_full_recompute",
     .dp = 2,
     .tp = 2,
     .ep = 2,
     .recompute = RecomputeGranularity::kFull,
     .shared_ffn = 32},
};

class PaddedMoeLayersTest : public testing::TestWithParam<MoeCase> {};

TEST_P(PaddedMoeLayersTest, EveryRankComputesWhatTheCpuLayerComputes) {
  check_group_against_reference<PaddedCpuBackend>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, PaddedMoeLayersTest, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<MoeCase>& param) {
                           return param.param.name;
                         });

// The harness's own check: the CPU runtime's MoeLayersCpu, which runs every setting, in
// the tested layer's place (with the host's all_to_all_v, which its exchanges follow), on
// the settings beyond EP, so that a failure of the padded layer there points at the padded
// layer, not at the harness (TP collectives, expert TP and shared-expert slices,
// recompute's second buffers); and a check of the CPU layer's splits on values.
const MoeCase kHarnessCases[] = {
    {.name = "ep_2", .dp = 2, .ep = 2},
    {.name = "experts_8_ep_2", .dp = 2, .ep = 2, .experts = 8},
    {.name = "tp_2_etp_1", .dp = 2, .tp = 2, .ep = 2, .expert_tp = 1},
    {.name = "tp_2_etp_2", .dp = 2, .tp = 2, .ep = 2, .expert_tp = 2},
    {.name = "cp_2", .dp = 1, .cp = 2, .ep = 2},
    {.name = "full_recompute", .dp = 2, .ep = 2, .recompute = RecomputeGranularity::kFull},
    {.name = "shared_expert", .dp = 2, .ep = 2, .shared_ffn = 32},
    {.name = "shared_expert_tp_2", .dp = 2, .tp = 2, .ep = 2, .shared_ffn = 32},
};

class MoeHarnessSelfCheck : public testing::TestWithParam<MoeCase> {};

TEST_P(MoeHarnessSelfCheck, TheCpuLayerOnEveryRankComputesWhatItComputesUnsplit) {
  check_group_against_reference<CpuBackend>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeHarnessSelfCheck, testing::ValuesIn(kHarnessCases),
                         [](const testing::TestParamInfo<MoeCase>& param) {
                           return param.param.name;
                         });

}  // namespace
}  // namespace dhelix::rt
